"""``quantscope FILE --screenshot PNG --view NAME``: how each view is shown for its picture. Each function here is the
``setup`` of one or more :class:`~quantscope.gui.views.registry.Shot` entries: it runs the view's real work (a chat
exchange, a probe, a conversion…) on the open file and returns the widget to grab (None: the window), or raises
:class:`ShotFailed`. :func:`quantscope.gui.app.render_screenshot` reads the registry; nothing here
lists the views. No Qt is imported at module level (the registry imports this module to build ``--view``'s choices)."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ShotFailed(Exception):
    """A screenshot that cannot be made: the one-line reason (printed after ``quantscope: ``) and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


#: The short real exchange the chat screenshot runs (greedy, so the picture is reproducible).
CHAT_DEMO_SYSTEM = "You are a concise, helpful assistant."
CHAT_DEMO_PROMPTS = ("Write a Python function that checks whether a number is prime.", "What is its time complexity?")

#: The prompt the probe screenshots run (``--view probe``, ``probe-attention``, ``probe-activations``).
PROBE_DEMO_PROMPT = ("The capital of France is Paris, and the capital of Italy is Rome. The largest planet of the "
                     "solar system is Jupiter, and the smallest is")


def wait_idle(app: object, win: object, timeout: float = 90.0) -> bool:
    """Process events until no background task runs (or ``timeout`` seconds pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        if not win.runner.running():  # type: ignore[attr-defined]
            for _ in range(5):
                app.processEvents()  # type: ignore[attr-defined]
                time.sleep(0.02)
            if not win.runner.running():  # type: ignore[attr-defined]
                return True
        time.sleep(0.02)
    return False


def wait_chat(app: object, chat: object, timeout: float = 600.0) -> bool:
    """Process events until the chat view's scripted exchange (load + replies) has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        if not chat.busy:  # type: ignore[attr-defined]
            return True
        time.sleep(0.01)
    return False


@dataclass
class ShotContext:
    """What a shot's setup works with: the app and window (the file open), ``--view``'s name, ``--size`` and the
    options that go with some views; :meth:`tempdir` gives a throw-away folder, removed after the picture."""

    app: Any
    win: Any
    name: str
    size: tuple[int, int]
    block: str | None = None
    compare_with: str | None = None
    imatrix: str | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def tempdir(self) -> Path:
        if self.tmp is None:
            self.tmp = tempfile.TemporaryDirectory(prefix="quantscope-shot-")
        return Path(self.tmp.name)

    def idle(self, timeout: float = 90.0) -> bool:
        return wait_idle(self.app, self.win, timeout)


def library(c: ShotContext) -> None:
    """The library (View ▸ Library) after its scan of this machine's stores (``HOME``, ``HF_HUB_CACHE``,
    ``OLLAMA_MODELS`` … say which), the first row selected."""
    c.win.show_library()
    view = c.win.library_view
    deadline = time.monotonic() + 90.0
    while time.monotonic() < deadline and (not view.scanned or view.job.busy):
        c.app.processEvents()
        time.sleep(0.02)
    if view.proxy.rowCount():
        view.table.selectRow(0)


def hub(c: ShotContext) -> Any:
    """File ▸ Models from the hub (the hub ``HF_ENDPOINT`` names): every GGUF repository, most downloaded first,
    the first one's files with their fit, the first file selected; the dialog at ``--size``."""
    c.win.show_hub()
    view, dlg = c.win.hub_view, c.win.hub_dialog
    dlg.resize(*c.size)

    def wait() -> None:
        deadline = time.monotonic() + 120.0
        c.app.processEvents()
        while time.monotonic() < deadline and view.job.busy:
            c.app.processEvents()
            time.sleep(0.02)

    view.search()
    wait()
    if not view.hits:
        raise ShotFailed(f"--view hub: {view.strip.status.text() or 'no GGUF repository on the hub'}")
    view.repos.selectRow(0)
    wait()
    if view.sets:
        view.files.selectRow(0)
    c.app.processEvents()
    return dlg


def tensors(c: ShotContext) -> None:
    """A representative weight selected in the tree."""
    f = c.win.doc.gguf if c.win.doc else None
    if f is not None and f.tensors:  # a vocabulary-only file has none
        name = next((n for n in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight") if f.has_tensor(n)),
                    f.tensors[0].name)
        c.win.tensors_view.select_tensor(name)
        c.win.tensors_view.lists.setCurrentIndex(0)


def block(c: ShotContext) -> None:
    """``--block TENSOR[:BLOCK]`` (default: the inspector's own first pick), element 37 selected."""
    if c.block:
        name, _, index = c.block.partition(":")
        f = c.win.doc.gguf if c.win.doc else None
        if f is None or not f.has_tensor(name) or (index and not index.isdigit()):
            raise ShotFailed(f"--block {c.block}: no such tensor (or block) in the file", 2)
        c.win.block_view.show_block(name, 0, int(index or 0))
    c.win.show_view("block")  # after the pick: a remote file's inspector reads only the block asked for
    c.idle()  # (a remote file's block is read in the runner)
    c.win.block_view.set_element(37)


def _chat_on_a_throwaway_store(c: ShotContext) -> Any:
    from quantscope.core.chat.store import ChatStore

    chat = c.win.chat_view
    chat.use_store(ChatStore(c.tempdir() / "chats.sqlite3"))  # before it is shown: the user's chats stay unread
    c.win.show_view("chat")
    return chat


def chat(c: ShotContext) -> None:
    """A short real exchange on the engine, saved to a throw-away database, the template preview shown; for an
    embedding model, the chat saying that it does not chat."""
    chat = _chat_on_a_throwaway_store(c)
    if c.win.serve_view.embedding is not None:
        wait_chat(c.app, chat)
        return
    chat.run_script(list(CHAT_DEMO_PROMPTS), system=CHAT_DEMO_SYSTEM, preset="Greedy", max_tokens=200)
    if not wait_chat(c.app, chat) or chat.error:
        raise ShotFailed(f"the chat exchange failed: {chat.error or 'timed out'}")
    chat.tools.setCurrentIndex(1)  # the template preview: the exact prompt of this conversation
    chat.update_preview()


def chat_tokens(c: ShotContext) -> None:
    """A reply coloured by probability, branched at its first uncertain word."""
    chat = _chat_on_a_throwaway_store(c)
    chat.run_script(["Name three colours and say in one sentence why you like each."],
                    system=CHAT_DEMO_SYSTEM, preset="Greedy", max_tokens=70)
    ok = wait_chat(c.app, chat) and not chat.error and chat.token_demo() and wait_chat(c.app, chat)
    if not ok or chat.error:
        raise ShotFailed(f"the token view's exchange failed: {chat.error or 'no branch point'}")


def metadata_edit(c: ShotContext) -> object:
    """The chat template editor, the sample conversation rendered with its tokens."""
    dlg = c.win.metadata_view.edit_template()
    if dlg is None:
        raise ShotFailed("--view metadata-edit needs a GGUF file", 2)
    dlg.resize(*c.size)
    c.idle()
    dlg.render_sample()  # again, now that the tokenizer is read: with the token ids
    c.idle()
    return dlg


def probe(c: ShotContext) -> None:
    """The Probe tab after a run of :data:`PROBE_DEMO_PROMPT`: the logit lens (``probe``), the attention of the
    first sliding-window layer, else the middle one, averaged over the heads (``probe-attention``), or the
    activations of the layer with the largest outlier channel (``probe-activations``)."""
    pv = c.win.probe_view
    pv.prompt.setPlainText(PROBE_DEMO_PROMPT)
    if not pv.run():
        raise ShotFailed(f"the probe did not start: {pv.error or pv.state}")
    c.idle(600)
    if pv.state != "done" or pv.result is None:
        raise ShotFailed(f"the probe failed: {pv.error or pv.state}")
    pr = pv.result.probe
    if c.name == "probe-attention":
        layers = [li for li in range(pr.n_layers) if pr.has_attention(li)]
        if not layers:
            raise ShotFailed("the model has no attention layer")
        windowed = [li for li in layers if pr.window(li)]
        pv.pages.setCurrentWidget(pv.attention_page)
        pv.attention_page.select(windowed[0] if windowed else layers[len(layers) // 2], -1)
        c.idle(600)
        if pv.attention_page.shown is None:
            raise ShotFailed(f"the attention weights failed: {pv.error or pv.state}")
        pv.attention_page.heat.pick(pr.n_tokens - 1, 0)
    elif c.name == "probe-activations":
        pv.pages.setCurrentWidget(pv.activations_page)


def serve(c: ShotContext) -> None:
    """The Serve tab serving on a free port after three real requests (a streamed chat reply, a completion and a
    refused one), the chat reply opened with its tokens tinted; for an embedding model two embedding requests
    (OpenAI's, Ollama's) and a refused one, counted in the status line. The server stops when the window
    closes."""
    import json
    import threading
    import urllib.error
    import urllib.request

    app, sv = c.app, c.win.serve_view
    sv.port_spin.setValue(0)
    sv.ctx_spin.setValue(min(sv.ctx_spin.value(), 2048))
    if not sv.start():
        raise ShotFailed("the server did not start")
    deadline = time.monotonic() + 300
    while sv.state == "loading" and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    if sv.state != "serving":
        raise ShotFailed(f"the server did not start: {sv.message or sv.state}")
    url, model = sv.server.url, sv.model_id
    emb = sv.embedding is not None  # an embedding model: two embedding requests and a refused one, counted
    bodies: list[tuple[str, dict]] = [
        ("/v1/chat/completions", {"model": model, "max_tokens": 60, "temperature": 0, "stream": True,
                                  "messages": [{"role": "user", "content": CHAT_DEMO_PROMPTS[0]}]}),
        ("/v1/completions", {"model": model, "max_tokens": 24, "temperature": 0,
                             "prompt": "The three primary colours are"}),
        ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})]
    if emb:
        bodies = [("/v1/embeddings", {"model": model, "input": ["Hello!", "How are you?"]}),
                  ("/api/embed", {"model": model, "input": "Hello!"}),
                  ("/v1/embeddings", {"model": "no-such-model", "input": "Hi"})]

    def send() -> None:
        for path, body in bodies:
            req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
            except urllib.error.HTTPError:
                pass

    t = threading.Thread(target=send, daemon=True)
    t.start()
    while t.is_alive() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.02)
    if emb:
        sv.poll()
        if "3 requests answered" not in sv.status_label.full_text():
            raise ShotFailed("the embedding requests were not answered")
        return
    if sv.model.rowCount() < 3:
        raise ShotFailed("the requests did not show in the panel")
    sv.table.selectRow(0)


def lab(c: ShotContext) -> None:
    """The Quant lab for ``requantize`` (a representative tensor in every candidate type, its worst block shown),
    ``quant-stats`` (every weight × every type, rows sampled) or ``budget`` (the costs measured, the front drawn,
    the budget at Q4_K_M's size)."""
    lab = c.win.lab_view
    if c.name == "requantize":
        name = lab.tensor_page.representative()
        if name is None:
            raise ShotFailed("--view requantize: the file has no weight to requantize")
        lab.open_tensor(name)
        c.idle(600)
        page = lab.tensor_page
        if page.state != "done":
            raise ShotFailed(f"requantizing {name} failed: {page.error or page.state}")
        return
    if c.name == "budget":  # every tensor's costs measured on the bundled sample text, the budget at Q4_K_M's size
        lab.pages.setCurrentWidget(lab.budget_page)
        if not lab.budget_page.start():
            raise ShotFailed("--view budget: the file cannot be measured")
        c.idle(3600)
        page = lab.budget_page
        if page.state != "done":
            raise ShotFailed(f"measuring the costs failed: {page.error or page.state}")
        return
    lab.pages.setCurrentWidget(lab.file_page)
    lab.file_page.start()
    c.idle(600)
    page = lab.file_page
    if page.state != "done":
        raise ShotFailed(f"the whole-file statistics failed: {page.error or page.state}")


def compare(c: ShotContext) -> object:
    """The open file as the base, ``--compare-with`` as the quant, the bundled sample text, run to the end, its
    worst position shown, at the window's size."""
    if not c.compare_with:
        raise ShotFailed("--view compare needs --compare-with GGUF (the quant)")
    cd = c.win.show_compare()
    if cd is None:
        raise ShotFailed("--view compare needs a GGUF file")
    cd.resize(*c.size)
    cd.other.setText(c.compare_with)
    cd.start()
    c.idle(600)
    if cd.state != "done":
        raise ShotFailed(f"the comparison failed: {cd.error or cd.state}")
    cd.show_worst(0)
    return cd


def imatrix(c: ShotContext) -> object:
    """``--imatrix`` (default: the open file) read, an expert's (else an ffn_down) tensor selected, at the window's
    size."""
    path = c.imatrix or str(c.win.doc.path)
    dlg = c.win.show_imatrix(path)
    dlg.resize(*c.size)
    c.idle()
    if dlg.imatrix is None:
        raise ShotFailed(f"{path}: {dlg.error or 'not read'}")
    names = list(dlg.imatrix.entries)
    experts = [n for n in names if dlg.imatrix.entries[n].n_mat > 1]
    pick = next((n for n in names if "ffn_down" in n), names[0]) if not experts else experts[0]
    dlg.select_tensor(pick)
    return dlg


def diff(c: ShotContext) -> object:
    """The open file compared with ``--compare-with`` to the end, the tensor of largest relative error located (both
    blocks shown), at the window's size."""
    if not c.compare_with:
        raise ShotFailed("--view diff needs --compare-with GGUF (the file compared with FILE)")
    dlg = c.win.show_diff()
    if dlg is None:
        raise ShotFailed("--view diff needs a GGUF file")
    dlg.resize(*c.size)
    dlg.set_other(c.compare_with)
    dlg.start()
    c.idle(600)
    if dlg.state != "done":
        raise ShotFailed(f"the comparison failed: {dlg.error or dlg.state}")
    first = next((n for n in dlg.tensor_names() if dlg.why_not(n) is None), None)
    if first is not None:
        dlg.select_tensor(first)
        c.idle(600)
    return dlg


def quantize(c: ShotContext) -> object:
    """The dialog at the window's size after a real Q4_K_M run into a temporary folder."""
    out = c.tempdir() / f"{c.win.doc.path.stem}-Q4_K_M.gguf" if c.win.doc else None
    qd = c.win.show_quantize()
    if qd is None or out is None:
        raise ShotFailed("--view quantize needs a GGUF file", 2)
    qd.resize(*c.size)
    qd.output.setText(str(out))
    qd.start()
    c.idle()
    if qd.state != "done":
        raise ShotFailed(f"quantization failed: {qd.error or qd.plan_error}")
    qd.table.scrollToTop()
    return qd


def convert(c: ShotContext) -> object:
    """The conversion to bump run into a temporary folder (a manifest written, the head dropped): the dialog
    (``convert``, at its own size) or the bump file it wrote, opened (``bump``)."""
    tmp = c.tempdir()
    dlg = c.win.show_convert()
    if dlg is None:
        raise ShotFailed("--view convert needs a GGUF file", 2)
    dlg.output.setText(str(tmp / (c.win.doc.path.stem + ".bump")))
    dlg.manifest_check.setChecked(True)
    dlg.manifest.setText(str(tmp / "manifest.json"))
    dlg.drop_head.setChecked(True)
    dlg.start()
    c.idle()
    if c.name == "convert":
        return dlg
    if dlg.result is None:
        raise ShotFailed(f"conversion failed: {dlg.error}")
    dlg._open_result()
    return None
