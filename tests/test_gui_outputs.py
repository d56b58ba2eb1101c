"""Where new files are proposed: never inside the model cache (~/.cache/quantscope/models, where the demo model
lives), but in the user's Documents folder (else home); beside the source for a file the user keeps elsewhere."""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtCore import QStandardPaths

from quantscope.core import catalog

from .gui_helpers import window  # noqa: F401


def _user_folder() -> Path:
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


def _outputs(window):  # noqa: F811
    conv = window.show_convert()
    quant = window.show_quantize()
    budget = window.lab_view.budget_page
    paths = {"bump": Path(conv.output.text()), "config": Path(conv.config.text()),
             "manifest": Path(conv.manifest.text()), "quantize": Path(quant.output.text()),
             "mix": Path(budget.output.text())}
    conv.close()
    quant.close()
    return paths


def test_outputs_of_the_demo_model_are_proposed_in_a_user_folder(window, model_path):  # noqa: F811
    src = model_path("smollm2")
    cache = catalog.cache_dir().resolve()
    assert src.resolve().parent == cache
    assert window.open_path(src)
    paths = _outputs(window)
    for what, p in paths.items():
        assert not p.resolve().is_relative_to(cache), (what, p)
        assert p.parent == _user_folder(), (what, p)
    assert paths["bump"].name == "SmolLM2-135M-Instruct.Q4_1.bump"
    assert paths["mix"].name == "SmolLM2-135M-Instruct.Q4_1-mix.gguf"


def test_a_file_kept_elsewhere_gets_its_outputs_beside_it(window, model_path, tmp_path):  # noqa: F811
    src = tmp_path / "mine" / "smol.gguf"
    src.parent.mkdir()
    shutil.copyfile(model_path("smollm2"), src)
    assert window.open_path(src)
    for what, p in _outputs(window).items():
        assert p.parent == src.parent, (what, p)
