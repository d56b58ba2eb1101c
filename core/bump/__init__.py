"""BUMPWGT3: plan, convert (a cancellable job), read/inspect and verify C-Kernel-Engine weight files."""

from .convert import BumpWriteError, Cancelled, CancelToken, ConvertJob, ConvertProgress, ConvertResult
from .format import DEFAULT_PROFILE, PROFILES
from .plan import BumpPlan, BumpRefusal, plan_conversion
from .reader import BumpError, BumpFile, describe, is_bump, open_bump, render_bump
from .verify import VerifyReport, verify_against

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "BumpError",
    "BumpFile",
    "BumpPlan",
    "BumpRefusal",
    "BumpWriteError",
    "CancelToken",
    "Cancelled",
    "ConvertJob",
    "ConvertProgress",
    "ConvertResult",
    "VerifyReport",
    "describe",
    "is_bump",
    "open_bump",
    "plan_conversion",
    "render_bump",
    "verify_against",
]
