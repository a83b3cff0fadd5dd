"""SummaryWriter: PyTorch's TensorBoard logger, writing through `tensorboard`'s EventFileWriter.

`FileWriter` puts Summary/Event protocol buffers into one event file of a directory (queued, flushed
every `flush_secs` or at `flush()`/`close()`). `SummaryWriter` is PyTorch's API over it: scalars
(and `add_scalars`, one sub-run per key, as PyTorch lays them out), histograms, images, figures,
text, hparams (a sub-run holding the plugin's summaries and the metrics) and graphs (see `_graph`).
"""
from __future__ import annotations

import os
import socket
import time
from datetime import datetime
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from . import summary as S
from ._graph import graph

DEFAULT_MAX_QUEUE = 10
DEFAULT_FLUSH_SECS = 120
FILE_VERSION = "brain.Event:2"


class FileWriter:
    """Events and summaries into an event file in `log_dir`."""

    def __init__(self, log_dir: str, max_queue: int = DEFAULT_MAX_QUEUE, flush_secs: int = DEFAULT_FLUSH_SECS,
                 filename_suffix: str = "") -> None:
        self.event_writer = EventFileWriter(str(log_dir), max_queue, flush_secs, filename_suffix)

    def get_logdir(self) -> str:
        return self.event_writer.get_logdir()

    def add_event(self, event: Event, step: int | None = None, walltime: float | None = None) -> None:
        event.wall_time = time.time() if walltime is None else walltime
        if step is not None:
            event.step = int(step)
        self.event_writer.add_event(event)

    def add_summary(self, summary, global_step: int | None = None, walltime: float | None = None) -> None:
        self.add_event(Event(summary=summary), global_step, walltime)

    def add_graph(self, graph_profile, walltime: float | None = None) -> None:
        graph_def, stepstats = graph_profile
        self.add_event(Event(graph_def=graph_def.SerializeToString()), None, walltime)
        trm = event_pb2.TaggedRunMetadata(tag="step1", run_metadata=stepstats.SerializeToString())
        self.add_event(Event(tagged_run_metadata=trm), None, walltime)

    def flush(self) -> None:
        self.event_writer.flush()

    def close(self) -> None:
        self.event_writer.close()

    def reopen(self) -> None:
        self.event_writer.reopen()


def _default_logdir(comment: str) -> str:
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", stamp + "_" + socket.gethostname() + comment)


class SummaryWriter:
    """Writes entries to event files in `log_dir` (default `runs/<time>_<host><comment>`) for TensorBoard."""

    def __init__(self, log_dir: str | None = None, comment: str = "", purge_step: int | None = None,
                 max_queue: int = DEFAULT_MAX_QUEUE, flush_secs: int = DEFAULT_FLUSH_SECS,
                 filename_suffix: str = "") -> None:
        self.log_dir = str(log_dir) if log_dir else _default_logdir(comment)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self.file_writer = self.all_writers = None
        self._get_file_writer()
        self.default_bins = S.tensorflow_bins()

    def _get_file_writer(self) -> FileWriter:
        """The writer of `log_dir`, (re)made on first use or after `close()`."""
        if self.all_writers is None or self.file_writer is None:
            self.file_writer = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:
                step, self.purge_step = self.purge_step, None
                self.file_writer.add_event(Event(step=step, file_version=FILE_VERSION))
                self.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        return self.file_writer

    def get_logdir(self) -> str:
        return self.log_dir

    def add_scalar(self, tag: str, scalar_value: Any, global_step: int | None = None, walltime: float | None = None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        self._get_file_writer().add_summary(S.scalar(tag, scalar_value, new_style, double_precision),
                                            global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict, global_step: int | None = None,
                    walltime: float | None = None) -> None:
        """Each key is a run of its own, `<log_dir>/<main_tag>_<key>`, so the curves share one chart."""
        walltime = time.time() if walltime is None else walltime
        base = self._get_file_writer().get_logdir()
        for tag, value in tag_scalar_dict.items():
            path = base + "/" + main_tag.replace("/", "_") + "_" + tag
            fw = self.all_writers.get(path)
            if fw is None:
                fw = self.all_writers[path] = FileWriter(path, self.max_queue, self.flush_secs, self.filename_suffix)
            fw.add_summary(S.scalar(main_tag, value), global_step, walltime)

    def add_tensor(self, tag: str, tensor: Any, global_step: int | None = None, walltime: float | None = None) -> None:
        self._get_file_writer().add_summary(S.tensor(tag, tensor), global_step, walltime)

    def add_histogram(self, tag: str, values: Any, global_step: int | None = None, bins: Any = "tensorflow",
                      walltime: float | None = None, max_bins: int | None = None) -> None:
        if isinstance(bins, str) and bins == "tensorflow":
            bins = self.default_bins
        self._get_file_writer().add_summary(S.histogram(tag, values, bins, max_bins), global_step, walltime)

    def add_image(self, tag: str, img_tensor: Any, global_step: int | None = None, walltime: float | None = None,
                  dataformats: str = "CHW") -> None:
        self._get_file_writer().add_summary(S.image(tag, img_tensor, dataformats=dataformats), global_step, walltime)

    def add_images(self, tag: str, img_tensor: Any, global_step: int | None = None, walltime: float | None = None,
                   dataformats: str = "NCHW") -> None:
        self._get_file_writer().add_summary(S.image(tag, img_tensor, dataformats=dataformats), global_step, walltime)

    def add_figure(self, tag: str, figure: Any, global_step: int | None = None, close: bool = True,
                   walltime: float | None = None) -> None:
        """A matplotlib figure (or a list of them, as a batch) rendered to an image."""
        figures = figure if isinstance(figure, list) else [figure]
        arrays = [S.figure_to_image(f, close) for f in figures]
        if isinstance(figure, list):
            self.add_images(tag, np.stack(arrays), global_step, walltime, dataformats="NHWC")
        else:
            self.add_image(tag, arrays[0], global_step, walltime, dataformats="HWC")

    def add_text(self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None) -> None:
        self._get_file_writer().add_summary(S.text(tag, text_string), global_step, walltime)

    def add_hparams(self, hparam_dict: dict, metric_dict: dict, hparam_domain_discrete: dict | None = None,
                    run_name: str | None = None, global_step: int | None = None) -> None:
        """One run `<log_dir>/<run_name>` (default: the time) with the hparams plugin's summaries and
        each metric as a scalar, as PyTorch lays it out."""
        if type(hparam_dict) is not dict or type(metric_dict) is not dict:
            raise TypeError("hparam_dict and metric_dict should be dictionary.")
        exp, ssi, sei = S.hparams(hparam_dict, metric_dict, hparam_domain_discrete)
        logdir = os.path.join(self._get_file_writer().get_logdir(), run_name or str(time.time()))
        with SummaryWriter(log_dir=logdir) as w:
            for s in (exp, ssi, sei):
                w.file_writer.add_summary(s, global_step)
            for k, v in metric_dict.items():
                w.add_scalar(k, v, global_step)

    def add_graph(self, model, input_to_model: Any = None, verbose: bool = False, use_strict_trace: bool = True) -> None:
        """The module's graph, traced with flambeau.fx: one node per submodule call or function, in the
        module scopes TensorBoard groups by, with output shapes when inputs are given."""
        self._get_file_writer().add_graph(graph(model, input_to_model, verbose))

    def flush(self) -> None:
        if self.all_writers is None:
            return
        for w in self.all_writers.values():
            w.flush()

    def close(self) -> None:
        if self.all_writers is None:
            return
        for w in self.all_writers.values():
            w.flush()
            w.close()
        self.file_writer = self.all_writers = None

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.close()
