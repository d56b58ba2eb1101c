"""The Serve tab (issue 38): the open model behind the local OpenAI-compatible server, and inside its requests.

The top card starts and stops the server (port, API key, parallel slots, context), shows its address and a
copyable example (curl, openai-python). Below, the Requests panel lists every generation request, live and
finished, from the server's request log (:class:`quantscope.core.server.RequestLog`, polled on a timer: the
server's threads never touch a widget); a selected request shows its prompt and its reply like a chat reply:
tokens tinted by probability, hover for the alternatives; "Probe this prompt" opens the Probe on it.

The server gets its own engine, loaded on a thread of its own: the chat's engine belongs to the chat's worker
thread and its session is the chat's KV cache, while the server's first slot is its engine's session and every
slot decodes on the server's thread. Sharing would mean pausing the chat and throwing its cache away at every
request. The weights are memory-mapped from the file, so what a second engine adds is mostly the repacked
weights and each slot's KV cache; the card says how much the slots take. Loading, binding, starting and stopping
all run off the GUI thread; the window waits for a stop only when it closes.

An embedding model (docs/embeddings.md) is served by the embedding server instead (its encoder, one request at a
time over the model's own positions: no slots or context to choose): the card lists its endpoints (OpenAI's
``/v1/embeddings``, Ollama's ``/api/embed``), the example asks for embeddings, and the status line counts the
requests answered (the Requests panel lists text generation requests only).
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from datetime import datetime
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from quantscope.core.summary import human_bytes

from ..document import Document
from ..guard import qt_guarded
from ..theme import BAD_COLOR
from ..widgets.fit import ElidedLabel
from .chat_settings import ispin
from .chat_tokens import ColorLegend
from .chat_widgets import MessageView, mono_font

POLL_MS = 150  # the request log and the server's state are looked at this often
COLUMNS = ("#", "Endpoint", "Client", "Status", "Prompt", "Output", "t/s", "Took", "API")
HEADER_TIPS = ("The request's number", "The API path; 'stream': server-sent events", "The client's address and port",
               "Where the request is, or how it ended (a refusal with its HTTP status)",
               "Prompt tokens (and how many came from the slot's cache)", "Completion tokens generated",
               "Generation speed, tokens per second", "From arrival to the last token",
               "The API the request spoke: OpenAI, Ollama or Anthropic")
DIALECTS = {"openai": "OpenAI", "ollama": "Ollama", "anthropic": "Anthropic"}
STATUS_TEXT = {"queued": "queued", "prompt": "reading prompt", "generating": "generating", "stop": "done",
               "length": "done (length)", "cancelled": "cancelled", "error": "error", "refused": "refused"}


def examples(url: str, model: str, key: str) -> dict[str, str]:
    """The copyable examples for the server at ``url``: curl and the openai Python client."""
    auth = f' \\\n  -H "Authorization: Bearer {key}"' if key else ""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}]})
    curl = (f"curl {url}/v1/chat/completions \\\n  -H \"Content-Type: application/json\"{auth} \\\n"
            f"  -d '{body}'")
    py = ("from openai import OpenAI\n\n"
          f"client = OpenAI(base_url=\"{url}/v1\", api_key=\"{key or 'none'}\")\n"
          "reply = client.chat.completions.create(\n"
          f"    model=\"{model}\",\n"
          "    messages=[{\"role\": \"user\", \"content\": \"Hello!\"}],\n"
          ")\n"
          "print(reply.choices[0].message.content)")
    return {"curl": curl, "python": py}


#: what an embedding server answers (core/server/embeddings.py), as the card lists it
EMBEDDING_ENDPOINTS = ("POST /v1/embeddings (OpenAI) · POST /api/embed, /api/embeddings (Ollama) · "
                       "GET /v1/models · POST /tokenize · GET /health")


def embedding_examples(url: str, model: str, key: str) -> dict[str, str]:
    """The copyable examples for an embedding server: curl and the openai Python client asking for vectors."""
    auth = f' \\\n  -H "Authorization: Bearer {key}"' if key else ""
    body = json.dumps({"model": model, "input": ["Hello!", "How are you?"]})
    curl = (f"curl {url}/v1/embeddings \\\n  -H \"Content-Type: application/json\"{auth} \\\n"
            f"  -d '{body}'")
    py = ("from openai import OpenAI\n\n"
          f"client = OpenAI(base_url=\"{url}/v1\", api_key=\"{key or 'none'}\")\n"
          "reply = client.embeddings.create(\n"
          f"    model=\"{model}\",\n"
          "    input=[\"Hello!\", \"How are you?\"],\n"
          ")\n"
          "print([len(d.embedding) for d in reply.data])")
    return {"curl": curl, "python": py}


@qt_guarded
class RequestsModel(QAbstractTableModel):
    """The request log as a table (rows: oldest first); :meth:`refresh` follows the log."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Any] = []

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return HEADER_TIPS[section]
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        r, c = self.rows[index.row()], index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self.text(r, c)
        if role == Qt.ItemDataRole.TextAlignmentRole and c in (0, 4, 5, 6, 7):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            if c == 3 and r.error:
                return r.error
            return (f"#{r.seq}: {r.endpoint}{' (streamed)' if r.stream else ''} from {r.client}, arrived "
                    f"{datetime.fromtimestamp(r.started).strftime('%H:%M:%S')}")
        if role == Qt.ItemDataRole.ForegroundRole and c == 3 and r.status in ("error", "refused"):
            from PySide6.QtGui import QColor

            return QColor(BAD_COLOR)
        return None

    @staticmethod
    def text(r: Any, c: int) -> str:
        if c == 0:
            return str(r.seq)
        if c == 1:
            return r.endpoint.removeprefix("/v1") + (" · stream" if r.stream else "")
        if c == 2:
            return r.client
        if c == 3:
            s = STATUS_TEXT.get(r.status, r.status)
            return f"{s} {r.http_status}" if r.status in ("refused", "error") else s
        if c == 4:
            return f"{r.prompt_tokens:,}" + (f" ({r.cached_tokens:,} cached)" if r.cached_tokens else "")
        if c == 5:
            return f"{r.completion_tokens:,}"
        if c == 6:
            tps = r.tokens_per_second
            return f"{tps:.1f}" if tps else "—"
        if c == 8:
            return DIALECTS.get(r.dialect, r.dialect)
        return f"{r.duration:.2f} s"

    def refresh(self, records: list[Any]) -> None:
        """Follow the log: new requests appended, the oldest gone, the live ones' cells updated."""
        old = [r.seq for r in self.rows]
        new = [r.seq for r in records]
        drop = 0
        while drop < len(old) and (not new or old[drop] < new[0]):
            drop += 1
        if drop:
            self.beginRemoveRows(QModelIndex(), 0, drop - 1)
            self.rows = self.rows[drop:]
            self.endRemoveRows()
        if [r.seq for r in self.rows] != new[: len(self.rows)]:  # not a prefix any more: start again
            self.beginResetModel()
            self.rows = list(records)
            self.endResetModel()
            return
        n = len(self.rows)
        if len(records) > n:
            self.beginInsertRows(QModelIndex(), n, len(records) - 1)
            self.rows = list(records)
            self.endInsertRows()
        if n:
            self.dataChanged.emit(self.index(0, 0), self.index(n - 1, len(COLUMNS) - 1))


@qt_guarded
class ServeView(QWidget):
    """The Serve tab (see the module's docstring). ``probeRequested(text)``: open the Probe on a prompt."""

    probeRequested = Signal(str)
    stateChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc: Document | None = None
        self.state = "idle"  # idle, loading, serving, stopping
        self.message = ""  # the outcome shown while idle (an error, "Stopped."), until the next start
        self.message_error = False
        self.port_in_use: int | None = None  # the port a start found in use (followed until it is free)
        self.server: Any = None
        self.engine: Any = None
        self.embedding: dict[str, Any] | None = None  # the open file's embedding facts (None: text generation)
        self._answered = -1  # the embedding server's answered requests, as last shown
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: tuple[str, Any, Any, str] | None = None  # what the start thread left: state, server, engine
        self._progress = ""
        self._stoppers: list[threading.Thread] = []
        self._version = -1
        self._shown: Any = None  # the request shown in the reply pane
        self._shown_done = False
        self._live_seq = -1  # the live request the reply pane streams
        self._build()
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.poll)
        self.set_document(None)

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        """The server card over the requests beside the request shown."""
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 10)
        lay.setSpacing(8)
        lay.addWidget(self._build_card())

        split = QSplitter(Qt.Orientation.Horizontal)
        split.setChildrenCollapsible(False)
        split.addWidget(self._build_requests())
        split.addWidget(self._build_request_detail())
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay.addWidget(split, 1)
        self.splitter = split
        self.embed_note = QLabel("An embedding server answers one request at a time with vectors: its answers are "
                                 "counted in the status line above (the Requests panel lists text generation "
                                 "requests, with their tokens).")
        self.embed_note.setObjectName("muted")
        self.embed_note.setWordWrap(True)
        self.embed_note.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.embed_note.hide()
        lay.addWidget(self.embed_note, 1)

    def _build_card(self) -> QFrame:
        """The served model, the settings and Start, the server's state, an example client request."""
        card = QFrame()
        card.setObjectName("card")
        card.setAccessibleName("Server")
        g = QGridLayout(card)
        g.setContentsMargins(10, 8, 10, 8)
        g.setHorizontalSpacing(10)
        g.setVerticalSpacing(6)
        self.model_label = ElidedLabel("No model", Qt.TextElideMode.ElideMiddle)
        self.model_label.setObjectName("modelName")
        self.model_label.setAccessibleName("Served model")
        row = self._build_settings_row()
        g.addWidget(self.model_label, 0, 0, 1, 2)
        g.addLayout(row, 1, 0, 1, 2)
        self.status_label = ElidedLabel("")
        self.status_label.setAccessibleName("Server state")
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        g.addWidget(self.status_label, 2, 0, 1, 2)
        self._build_example(g)
        self.endpoints_label = ElidedLabel("Endpoints: " + EMBEDDING_ENDPOINTS)
        self.endpoints_label.setAccessibleName("Endpoints")
        self.endpoints_label.setToolTip("Endpoints: " + EMBEDDING_ENDPOINTS.replace(" · ", "\n"))
        self.endpoints_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.endpoints_label.hide()
        g.addWidget(self.endpoints_label, 5, 0, 1, 2)
        return card

    def _build_settings_row(self) -> QHBoxLayout:
        """Port, API key, Slots, Context … Start serving."""
        self.port_spin = ispin(0, 65535, "Port", "The port to listen on, on this machine only (127.0.0.1); "
                               "0 picks a free one")
        self.port_spin.setGroupSeparatorShown(False)
        self.port_spin.setValue(8080)
        self.key_edit = QLineEdit()
        self.key_edit.setAccessibleName("API key")
        self.key_edit.setPlaceholderText("none (optional)")
        self.key_edit.setToolTip("When set, clients must send 'Authorization: Bearer KEY' (/health stays open)")
        self.slots_spin = ispin(1, 16, "Parallel slots", "Requests served at once, decoded together; each slot "
                                "has its own KV cache of the full context")
        self.slots_spin.setValue(2)
        self.ctx_spin = ispin(64, 131072, "Context", "The context of each slot, in tokens")
        self.ctx_spin.setSingleStep(512)
        self.ctx_spin.setValue(4096)
        self.start_btn = QPushButton("Start serving")
        self.start_btn.setAccessibleName("Start or stop the server")
        self.start_btn.setDefault(False)
        self.start_btn.clicked.connect(self.toggle)
        row = QHBoxLayout()
        row.setSpacing(8)
        self._generation_only: list[QWidget] = []  # hidden for an embedding model
        for text, w in (("Port", self.port_spin), ("API key", self.key_edit), ("Slots", self.slots_spin),
                        ("Context", self.ctx_spin)):
            lab = QLabel(text)
            lab.setBuddy(w)
            if w in (self.slots_spin, self.ctx_spin):
                self._generation_only += [lab, w]
            row.addWidget(lab)
            row.addWidget(w, 2 if w is self.key_edit else 0)
        self.key_edit.setMaximumWidth(360)
        row.addStretch(1)
        row.addWidget(self.start_btn)
        return row

    def _build_example(self, g: QGridLayout) -> None:
        """The example client (curl or Python) with Copy, and its text, in rows 3 and 4 of the card."""
        ex = QHBoxLayout()
        ex.setSpacing(6)
        self.example_combo = QComboBox()
        self.example_combo.setAccessibleName("Example client")
        self.example_combo.addItem("curl", "curl")
        self.example_combo.addItem("Python (openai)", "python")
        self.example_combo.currentIndexChanged.connect(lambda _i: self._show_example())
        self.copy_btn = QPushButton("Copy")
        self.copy_btn.setAccessibleName("Copy the example")
        self.copy_btn.clicked.connect(self.copy_example)
        ex.addWidget(QLabel("Example"))
        ex.addWidget(self.example_combo)
        ex.addWidget(self.copy_btn)
        ex.addStretch(1)
        g.addLayout(ex, 3, 0, 1, 2)
        self.example = QPlainTextEdit()
        self.example.setAccessibleName("Example request")
        self.example.setReadOnly(True)
        self.example.setFont(mono_font())
        self.example.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        fm = self.example.fontMetrics()
        self.example.setFixedHeight(fm.lineSpacing() * 7 + 12)
        g.addWidget(self.example, 4, 0, 1, 2)

    def _build_requests(self) -> QWidget:
        """The left pane: the requests served, newest last."""
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.setSpacing(4)
        head = QLabel("<b>Requests</b>")
        self.count_label = QLabel()
        self.count_label.setObjectName("muted")
        hl = QHBoxLayout()
        hl.addWidget(head)
        hl.addWidget(self.count_label, 1)
        ll.addLayout(hl)
        self.model = RequestsModel(self)
        self.table = QTableView()
        self.table.setAccessibleName("Requests")
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.selectionModel().currentRowChanged.connect(lambda cur, _p: self.show_request(cur.row()))
        ll.addWidget(self.table, 1)
        return left

    def _build_request_detail(self) -> QWidget:
        """The right pane: the request shown, its colouring and Probe button, its prompt over its reply."""
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(4)
        top = QHBoxLayout()
        self.detail_title = ElidedLabel("Select a request to see its prompt and reply.")
        self.detail_title.setAccessibleName("Request shown")
        self.color_combo = QComboBox()
        self.color_combo.setAccessibleName("Colour the reply by")
        for text, mode in (("Probability", "probability"), ("Entropy", "entropy"), ("Off", "off")):
            self.color_combo.addItem(text, mode)
        self.color_combo.currentIndexChanged.connect(lambda _i: self._recolor())
        self.probe_btn = QPushButton("Probe this prompt")
        self.probe_btn.setAccessibleName("Probe this prompt")
        self.probe_btn.setToolTip("Open the Probe tab on this request's prompt (logit lens, attention, activations)")
        self.probe_btn.clicked.connect(self.probe_prompt)
        top.addWidget(self.detail_title, 1)
        top.addWidget(QLabel("Colour by"))
        top.addWidget(self.color_combo)
        top.addWidget(self.probe_btn)
        rl.addLayout(top)
        self.legend = ColorLegend()
        rl.addWidget(self.legend)
        vsplit = QSplitter(Qt.Orientation.Vertical)
        vsplit.setChildrenCollapsible(False)
        self.prompt_view = QPlainTextEdit()
        self.prompt_view.setAccessibleName("Request prompt")
        self.prompt_view.setReadOnly(True)
        self.prompt_view.setFont(mono_font())
        self.prompt_view.setPlaceholderText("The prompt as the model read it (after the chat template)")
        vsplit.addWidget(self.prompt_view)
        self.reply_view = MessageView(0, "assistant", "", "chat")
        for b in (self.reply_view.edit_btn, self.reply_view.regen_btn):
            b.hide()
        self.reply_scroll = QScrollArea()
        self.reply_scroll.setWidgetResizable(True)
        self.reply_scroll.setFrameShape(QFrame.Shape.NoFrame)
        holder = QWidget()
        hl2 = QVBoxLayout(holder)
        hl2.setContentsMargins(0, 0, 0, 0)
        hl2.addWidget(self.reply_view)
        hl2.addStretch(1)
        self.reply_scroll.setWidget(holder)
        self.reply_scroll.setAccessibleName("Request reply")
        vsplit.addWidget(self.reply_scroll)
        vsplit.setSizes([120, 300])
        rl.addWidget(vsplit, 1)
        return right

    # ------------------------------------------------------------------ the document
    def set_document(self, doc: Document | None) -> None:
        """A new file (or none): a running server is stopped (it serves the file it was started on)."""
        if self.state in ("loading", "serving"):
            self.stop()
        self.doc = doc if doc is not None and doc.gguf is not None else None
        self.embedding = None
        if self.doc is not None:
            from quantscope.core.summary import embedding_summary

            self.embedding = embedding_summary(self.doc.gguf)  # type: ignore[arg-type]
        emb = self.embedding is not None
        for w in self._generation_only:
            w.setVisible(not emb)
        self.endpoints_label.setVisible(emb)
        self.splitter.setVisible(not emb)
        self.embed_note.setVisible(emb)
        if self.doc is not None:
            self.model_label.setText(self.doc.path.name)
            n_train = int(getattr(self.doc.gguf, "context_length", 0) or 0)  # type: ignore[union-attr]
            if n_train:
                self.ctx_spin.setValue(min(self.ctx_spin.value(), max(64, n_train)))
        else:
            self.model_label.setText("No model: open a GGUF file to serve it")
        self._update()

    @property
    def model_id(self) -> str:
        from quantscope.core.server import model_id_of

        return model_id_of(self.doc.path) if self.doc is not None else "model"

    @property
    def url(self) -> str:
        if self.server is not None:
            return str(self.server.url)
        return f"http://127.0.0.1:{self.port_spin.value() or 8080}"

    # ------------------------------------------------------------------ start / stop
    def toggle(self) -> None:
        if self.state in ("loading", "serving"):
            self.stop()
        elif self.state == "idle":
            self.start()

    def start(self) -> bool:
        """Load the model and start the server on a thread (never waits); False when it cannot start now."""
        if self.doc is None or self.state != "idle":
            return False
        key = self.key_edit.text().strip()
        if key and (any(c.isspace() for c in key) or not key.isprintable()):
            self._set_message("The API key must be printable text without spaces.", error=True)
            return False
        self._cancel = threading.Event()
        self._result = None
        self._progress = "loading the model…"
        args = (self.doc.path, self.port_spin.value(), key or None, self.slots_spin.value(), self.ctx_spin.value(),
                self._cancel, self.embedding is not None)
        self._thread = threading.Thread(target=self._start_thread, args=args, name="quantscope-serve-start",
                                        daemon=True)
        self.state = "loading"
        self.message, self.message_error, self.port_in_use = "", False, None
        self._thread.start()
        self.timer.start()
        self._update()
        return True

    def _start_thread(self, path: Any, port: int, key: str | None, slots: int, ctx: int,
                      cancel: threading.Event, embedding: bool = False) -> None:
        """Off the GUI thread: the engine (an embedding model: the encoder), the slots, the socket, then serving.
        Leaves ``_result``."""
        from quantscope.core.engine.encoder import Encoder
        from quantscope.core.engine.generate import Engine, LoadCancelled, load_failure
        from quantscope.core.server import EmbeddingServer, Server, model_id_of

        eng = srv = None
        try:
            def progress(stage: str, f: float) -> None:
                self._progress = f"loading the model: {stage} {f * 100:.0f}%"

            eng = Encoder(path) if embedding else Engine(path, n_ctx=ctx, threads=0, backend="cpu",
                                                          progress=progress, cancel=cancel)
            if cancel.is_set():
                raise LoadCancelled("cancelled")
            self._progress = "starting the server…"
            try:
                srv = (EmbeddingServer(eng, model_id_of(path), port=port, api_key=key) if embedding else
                       Server(eng, model_id_of(path), port=port, parallel=slots, api_key=key, trace=True))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    self.port_in_use = port  # (before the result: the GUI thread follows the port from then on)
                    why = f"Port {port} is in use: choose another port (0 picks a free one)."
                else:
                    why = f"Cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}."
                raise _Refused(why) from None
            except MemoryError:
                raise _Refused(f"Not enough memory for {slots} slots of {ctx:,} tokens: lower the slots or the "
                               "context.") from None
            srv.start()
            if cancel.is_set():
                raise LoadCancelled("cancelled")
            self._result = ("serving", srv, eng, "")
            return
        except LoadCancelled:
            why = ""
        except _Refused as exc:
            why = str(exc)
        except Exception as exc:
            f = load_failure(exc) if not isinstance(exc, RuntimeError) else None
            why = f.headline if f is not None else f"The server could not start: {exc or type(exc).__name__}"
        if srv is not None:
            srv.stop()
        if eng is not None:
            eng.close()
        self._result = ("idle", None, None, why)

    def stop(self) -> None:
        """Stop serving (requests in flight end as cancelled) on a thread of its own; never waits."""
        if self.state == "loading":
            self._cancel.set()  # the start thread cleans up after itself
            self.state = "stopping"
            self._update()
            return
        if self.state != "serving":
            return
        srv, eng = self.server, self.engine
        self.server = self.engine = None

        def run() -> None:
            try:
                srv.stop()
            finally:
                eng.close()

        t = threading.Thread(target=run, name="quantscope-serve-stop", daemon=True)
        self._stoppers.append(t)
        t.start()
        self.state = "stopping"
        self._update()

    def shutdown(self, timeout_s: float = 30.0) -> bool:
        """The window closes: stop serving and wait for every thread of the server (the only blocking wait)."""
        self.timer.stop()
        self.stop()
        end = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(max(0.0, end - time.monotonic()))
            res = self._result
            if res is not None and res[1] is not None:  # it started just now: stop it here
                res[1].stop()
                res[2].close()
                self._result = None
        for t in self._stoppers:
            t.join(max(0.0, end - time.monotonic()))
        ok = all(not t.is_alive() for t in self._stoppers) and (self._thread is None or not self._thread.is_alive())
        self.state = "idle"
        return ok

    @property
    def busy(self) -> bool:
        """Loading or stopping (a screenshot or a test waits for it)."""
        return self.state in ("loading", "stopping")

    # ------------------------------------------------------------------ polling
    def poll(self) -> None:
        """Follow the start/stop threads and the request log (on the timer)."""
        if self.state in ("loading", "stopping") and self._thread is not None and not self._thread.is_alive():
            res, self._result, self._thread = self._result, None, None
            if res is not None:
                state, srv, eng, why = res
                if state == "serving" and self.state == "stopping":  # stopped while it started
                    self.server, self.engine, self.state = srv, eng, "serving"
                    self.stop()
                elif state == "serving":
                    self.server, self.engine, self.state = srv, eng, "serving"
                    self._version = self._answered = -1
                    self.model.refresh([])
                    self._show_example()
                else:
                    self.state, self.message, self.message_error = "idle", why, bool(why)
            self._update()
        if self.state == "stopping" and self._thread is None:
            self._stoppers = [t for t in self._stoppers if t.is_alive()]
            if not self._stoppers:
                self.state = "idle"
                self.message, self.message_error = "Stopped.", False
                self._update()
        if self.state == "loading":
            self.status_label.setText(self._progress)
        srv = self.server
        if srv is not None:
            log = srv.app.log
            if log.version != self._version:
                self._version = log.version
                self.refresh_requests()
        if srv is not None and self.embedding is not None:
            n = sum(srv.app.http_requests.values())
            if n != self._answered:
                self._answered = n
                self._show_status(self._serving_text())
        if self.state == "idle" and self.port_in_use is not None:
            self._check_port()
        if self.state == "idle" and not self._stoppers and self._thread is None and self.port_in_use is None:
            self.timer.stop()

    def _check_port(self) -> None:
        """While "port N is in use" is shown: once N is free (the other program let it go), say so."""
        port = self.port_in_use
        if port is None or self.message_error is False:
            self.port_in_use = None
            return
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return
        self.port_in_use = None
        if self.port_spin.value() == port:
            self._set_message(f"Port {port} is free now: Start serving.")
        else:
            self.message = ""
            self._update()

    def refresh_requests(self) -> None:
        srv = self.server
        if srv is None:
            return
        recs = srv.app.log.records()
        self.model.refresh(recs)
        live = sum(not r.done for r in recs)
        self.count_label.setText(f"{len(recs):,} kept (the last {srv.app.log.limit}) · {live} live")
        if self._shown is not None and not self._shown_done:
            self._fill_detail(self._shown)
        sched = getattr(srv, "scheduler", None)
        if sched is None:  # the embedding server: its answers are counted in poll
            return
        self.status_label.setText(self._serving_text() + f" · {sched.busy_slots}/{len(sched.slots)} slots busy"
                                  + (f", {sched.queued} queued" if sched.queued else ""))

    # ------------------------------------------------------------------ showing a request
    def show_request(self, row: int) -> None:
        if not 0 <= row < len(self.model.rows):
            self._shown = None
            self._update_detail_buttons()
            return
        self._shown = self.model.rows[row]
        self._shown_done = False
        self._fill_detail(self._shown)

    def _fill_detail(self, r: Any) -> None:
        done = r.done
        self.detail_title.setText(f"Request #{r.seq} · {STATUS_TEXT.get(r.status, r.status)}"
                                  + (f": {r.error}" if r.error else ""))
        self.detail_title.setToolTip(f"#{r.seq}: {r.endpoint}{' (streamed)' if r.stream else ''} from {r.client}"
                                     + (f"\n{r.error}" if r.error else ""))
        if self.prompt_view.toPlainText() != r.prompt_text:
            self.prompt_view.setPlainText(r.prompt_text)
        mode = "chat" if "chat" in r.endpoint or r.dialect == "anthropic" else "completion"
        v = self.reply_view
        v.set_mode(mode)
        self._recolor()
        if not done:  # streaming: new text appended, tinted by the records that came with it
            if not v.streaming or self._live_seq != r.seq:
                v.start_streaming()
                self._live_seq = r.seq
            v.records = r.records
            v._tmap = None
            if len(r.text) > len(v.content):
                v.append(r.text[len(v.content):])
            v.set_stats(f"{r.completion_tokens:,} tokens so far · {r.tokens_per_second:.1f} t/s")
        else:
            v.records = []  # (finish renders the text again: no tints of other records on it)
            v.finish(r.text, f"{r.completion_tokens:,} tokens · {r.tokens_per_second:.1f} t/s · "
                     f"{r.duration:.2f} s" if r.status != "refused" else "")
            v.set_records(r.records)
            self._live_seq = -1
            self._shown_done = True
        self._update_detail_buttons()

    def _recolor(self) -> None:
        mode = str(self.color_combo.currentData() or "off")
        has = self._shown is not None and self._shown.trace is not None
        self.legend.set_mode(mode if has else "off")
        self.reply_view.set_color_mode(mode)

    def _update_detail_buttons(self) -> None:
        r = self._shown
        self.probe_btn.setEnabled(r is not None and bool(r.prompt_text))

    def probe_prompt(self) -> bool:
        """Open the Probe on the shown request's prompt. Its opening BOS text is left to the probe's tokenizer only
        when that tokenizer adds BOS itself (``add_bos_token``); otherwise (SmolLM2) the text keeps it, so the
        probe reads the tokens the server read."""
        r = self._shown
        if r is None or not r.prompt_text:
            return False
        text = r.prompt_text
        bos = self._bos_text()
        if bos and text.startswith(bos):
            text = text[len(bos):]
        self.probeRequested.emit(text)
        return True

    def _bos_text(self) -> str:
        eng = self.engine
        if eng is None or eng.tokenizer.bos_id is None or not getattr(eng.tokenizer, "add_bos", False):
            return ""
        return bytes(eng.tokenizer.token_bytes(eng.tokenizer.bos_id, True)).decode("utf-8", "replace")

    # ------------------------------------------------------------------ the card
    def _serving_text(self) -> str:
        srv = self.server
        if srv is None:
            return ""
        if self.embedding is not None:
            e = self.embedding
            answers = sum(srv.app.http_requests.values())
            key = " · API key required" if srv.app.config.api_key else ""
            return (f"Serving embeddings at {srv.url}/v1 (this machine only) · {e['pooling']} pooling, "
                    f"{e['width']:,} values a vector{key} · {answers:,} request{'s' if answers != 1 else ''} "
                    "answered")
        n = len(srv.scheduler.slots)
        kv = sum(int(getattr(s.session, "kv_bytes", 0)) for s in srv.scheduler.slots)
        key = " · API key required" if srv.app.config.api_key else ""
        return (f"Serving at {srv.url}/v1 (this machine only) · {n} slot{'s' if n > 1 else ''} × "
                f"{self.engine.n_ctx:,} tokens · KV caches {human_bytes(kv)}{key}")

    def _set_message(self, text: str, error: bool = False) -> None:
        """An outcome (an error, "Stopped.", a port that is free again): shown while idle, until the next start."""
        self.message, self.message_error = text, error
        self._show_status(text, error)

    def _show_status(self, text: str, error: bool = False) -> None:
        """``text`` in the status line; red only for an ``error`` (serving, loading or idle are not errors)."""
        self.status_label.setText(text)
        self.status_label.setStyleSheet(f"color: {BAD_COLOR};" if error else "")

    def _show_example(self) -> None:
        which = str(self.example_combo.currentData() or "curl")
        key = self.server.app.config.api_key if self.server is not None else self.key_edit.text().strip()
        make = embedding_examples if self.embedding is not None else examples
        self.example.setPlainText(make(self.url, self.model_id, key or "")[which])

    def copy_example(self) -> None:
        QGuiApplication.clipboard().setText(self.example.toPlainText())

    def _update(self) -> None:
        s = self.state
        editable = s == "idle"
        for w in (self.port_spin, self.key_edit, self.slots_spin, self.ctx_spin):
            w.setEnabled(editable)
        self.start_btn.setText({"idle": "Start serving", "loading": "Cancel", "serving": "Stop serving",
                                "stopping": "Stopping…"}[s])
        self.start_btn.setEnabled(self.doc is not None and s != "stopping")
        if s == "serving":
            self._show_status(self._serving_text())
        elif s == "loading":
            self._show_status(self._progress)
        elif s == "stopping":
            self._show_status("Stopping: requests in flight end as cancelled…")
        elif self.message:
            self._show_status(self.message, self.message_error)
        else:
            self._show_status(("Not serving. Start to serve this embedding model's vectors over the OpenAI and "
                               "Ollama APIs on this machine." if self.embedding is not None else
                               "Not serving. Start to make the model reachable over the OpenAI API on this machine "
                               "(the chat keeps its own copy of the model).") if self.doc is not None else "")
        self._show_example()
        self._update_detail_buttons()
        self.stateChanged.emit(s)


class _Refused(Exception):
    """The server cannot start, for a reason said in one line."""
