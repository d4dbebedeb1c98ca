"""smelt: a graph compiler that makes deep-learning models fit in GPU memory
and run fast, and tells you where every byte goes.

The same compiler as the ``smelt`` command line, from Python::

    >>> import smelt
    >>> model = smelt.load("zoo:mobilenet_v2", batch=8)
    >>> plan = model.plan(precision="mixed-f16")
    >>> plan.arena_bytes <= plan.naive_activation_bytes
    True
    >>> step = model.plan(train="adam")
    >>> sorted(step.breakdown)[:3]
    ['accumulators', 'activations', 'batch']

:func:`load` opens an ONNX file, ONNX bytes, an ``onnx.ModelProto``, a smelt
text IR file or a built-in model (``"zoo:resnet50"``);
:func:`from_torch` exports a ``torch.nn.Module``. A :class:`Model` then
inspects, plans, fits, compiles and runs. Results are objects with the
CLI's ``--json`` as :meth:`to_dict`, and show as a table with the memory
picture in Jupyter. Failures raise :class:`smelt.Error` subclasses with the
CLI's messages (:mod:`smelt.errors`).
"""

from __future__ import annotations

import html
import inspect as _inspect
import io
import json
import os
import sys
import tempfile
import warnings
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _smelt
from .errors import Error, InternalError, MemoryLimitError, ModelError, UnsupportedError, UsageError

__all__ = [
    "load",
    "from_torch",
    "Model",
    "Inspection",
    "Plan",
    "Fit",
    "Build",
    "Training",
    "Error",
    "ModelError",
    "UnsupportedError",
    "UsageError",
    "MemoryLimitError",
    "InternalError",
    "parse_size",
]

__version__ = _smelt.version()

Size = Union[int, str]
"""Bytes, or a size with a unit such as ``"6GiB"`` or ``"512MB"``."""

# numpy's dtype for each of smelt's.
_NUMPY = {
    "f32": np.float32,
    "f16": np.float16,
    "i64": np.int64,
    "i32": np.int32,
    "bool": np.bool_,
    "i8": np.int8,
    "u8": np.uint8,
    "i16": np.int16,
    "u16": np.uint16,
    "u32": np.uint32,
}


def parse_size(size: Size) -> int:
    """Bytes in ``size``: an int, or a string such as ``"6GiB"``, ``"512MB"`` (as ``--memory-limit``)."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise UsageError(f"{size!r} is not a size: give bytes (int) or a string like '6GiB'")
    if isinstance(size, int):
        if size < 0:
            raise UsageError(f"{size} is not a size: it is negative")
        return size
    return _smelt.parse_size(size)


def human_bytes(b: int) -> str:
    """``b`` bytes in binary units, as the CLI prints them (``45.9 MiB``)."""
    return _smelt.human_bytes(b)


# ---------------------------------------------------------------- loading


def load(
    model: Union[str, "os.PathLike[str]", bytes, Any],
    batch: Optional[int] = None,
    dims: Optional[Mapping[str, int]] = None,
) -> "Model":
    """Opens a model.

    ``model`` is a path to an ``.onnx`` or ``.tir`` file, ``"zoo:NAME"`` (a
    built-in model with deterministic random weights: ``zoo:resnet50``,
    ``zoo:mobilenet_v2``, ``zoo:bert_base``, ``zoo:gpt2``...), the bytes of
    an ONNX file, or an ``onnx.ModelProto``.

    ``batch`` replaces the exported batch size and ``dims`` sizes named
    symbolic dimensions (``{"sequence": 128}``); both can be changed per
    call later. The model is checked (imported and verified) now, so a bad
    file fails here with :class:`ModelError` or :class:`UnsupportedError`.
    """
    if hasattr(model, "SerializeToString") and not isinstance(model, (bytes, bytearray)):
        return _from_bytes(model.SerializeToString(), getattr(model.graph, "name", "") or "model", batch, dims)
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _from_bytes(bytes(model), "model", batch, dims)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str):
        raise TypeError(f"smelt.load takes a path, 'zoo:NAME', ONNX bytes or an onnx.ModelProto, not {type(model).__name__}")
    if not model.startswith("zoo:") and not os.path.exists(model):
        raise FileNotFoundError(2, "no such model file", model)
    m = Model(model, model, batch, dims)
    m._check()
    return m


def _from_bytes(data: bytes, name: str, batch: Optional[int], dims: Optional[Mapping[str, int]]) -> "Model":
    # The library reads models by path (the fit search and batch changes
    # reopen them): the bytes go to a private file, removed with the model.
    fd, path = tempfile.mkstemp(prefix="smelt-", suffix=".onnx")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    m = Model(path, f"<{name}: ONNX bytes>", batch, dims)
    weakref.finalize(m, _remove, path)
    m._onnx = data
    m._check()
    return m


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def from_torch(
    module: Any,
    example_inputs: Any,
    dynamic: Optional[Mapping[str, int]] = None,
    train: bool = False,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    opset: int = 17,
) -> "Model":
    """Exports a ``torch.nn.Module`` through ``torch.onnx.export`` (in
    memory, the TorchScript exporter) and opens it.

    ``example_inputs`` is a tensor or a tuple of tensors, as ``module``
    takes them; their shapes are the model's. ``dynamic`` names the axes
    that may change size, the same for every input and output:
    ``{"batch": 0}`` (the default) makes axis 0 the batch, so
    ``plan(batch=64)`` works; a transformer adds ``"sequence": 1``, sized
    later with ``dims={"sequence": 512}``. ``train=True`` exports for
    training: no constant folding, so every parameter stays an initializer
    under its PyTorch name (the module is exported in eval mode either way;
    ``plan(train="adam")`` builds the training step), and the step trains
    exactly the parameters PyTorch trains (those with ``requires_grad``,
    passed as the CLI's ``--trainable``; ``trainable=`` or ``train_only=``
    override it). Input names default to ``forward``'s parameter names.

    Needs ``torch`` (and ``onnx``, which its exporter uses).
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised without torch
        raise ModuleNotFoundError("smelt.from_torch needs PyTorch: pip install torch onnx") from e
    if dynamic is None:
        dynamic = {"batch": 0}
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise UsageError("example_inputs must be a tensor or a tuple of tensors")
    if input_names is None:
        try:
            params = [p for p in _inspect.signature(module.forward).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            input_names = [p.name for p in params[: len(inputs)]]
        except (TypeError, ValueError):
            input_names = []
        if len(input_names) != len(inputs):
            input_names = [f"input_{i}" for i in range(len(inputs))]
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            outs = module(*inputs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        if output_names is None:
            output_names = ["output"] if len(outs) == 1 else [f"output_{i}" for i in range(len(outs))]
        axes = {}
        for name, t in list(zip(input_names, inputs)) + list(zip(output_names, outs)):
            a = {axis: dim for dim, axis in dynamic.items() if hasattr(t, "dim") and axis < t.dim()}
            if a:
                axes[name] = a
        def export(mode):
            buf = io.BytesIO()
            with warnings.catch_warnings():
                # The TorchScript exporter is deprecated (its replacement needs
                # onnxscript and gives static shapes) and its tracer warns about
                # torch's own shape checks.
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                torch.onnx.export(
                    module,
                    inputs,
                    buf,
                    dynamo=False,
                    opset_version=opset,
                    input_names=list(input_names),
                    output_names=list(output_names),
                    dynamic_axes=axes or None,
                    do_constant_folding=not train,
                    training=mode,
                )
            module.eval()
            return buf.getvalue()

        # In training mode the exporter keeps parameters of equal values
        # apart (a fresh model's norms); it also exports batch norms and
        # dropout as in training: used only without them, and where smelt
        # refuses the result (a functional dropout that drops, a DropPath),
        # the model is exported in eval mode instead.
        modes = [torch.onnx.TrainingMode.EVAL]
        if train and _no_train_mode_ops(module):
            modes.insert(0, torch.onnx.TrainingMode.TRAINING)
        exported = [(mode, export(mode)) for mode in modes[:1]]
    finally:
        module.train(was_training)
    batch = inputs[0].shape[0] if "batch" in dynamic and inputs[0].dim() > dynamic["batch"] else None
    sized = {d: int(inputs[0].shape[a]) for d, a in dynamic.items() if d != "batch" and a < inputs[0].dim()}
    mode, data = exported[0]
    try:
        m = _from_bytes(data, type(module).__name__, batch, sized or None)
    except Error:
        if mode == torch.onnx.TrainingMode.EVAL:
            raise
        was_training = module.training
        try:
            data = export(torch.onnx.TrainingMode.EVAL)
        finally:
            module.train(was_training)
        m = _from_bytes(data, type(module).__name__, batch, sized or None)
    if train:
        m._trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    return m


def _no_train_mode_ops(module):
    """Whether `module` exports alike in training mode: no batch norm, no
    dropout that drops."""
    import torch

    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return False
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return False
    return True


# ---------------------------------------------------------------- the model

# Options of the training step, as keyword arguments of plan(), fit() and
# train() (the CLI's flags with '_' for '-').
_TRAIN_FLAGS = (
    "loss",
    "loss_on",
    "label_smoothing",
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "cosine",
    "warmup",
    "clip_norm",
    "batch_norm",
    "loss_scale",
    "freeze",
    "trainable",
    "train_only",
)


def _check_training(training: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(training) - set(_TRAIN_FLAGS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword arguments {unknown}; training options are {list(_TRAIN_FLAGS)}")


class Model:
    """A model opened by :func:`load` or :func:`from_torch`.

    Every method compiles it afresh under its arguments (batch, precision,
    training step...), exactly as the CLI's command of the same name does.
    """

    def __init__(self, spec: str, name: str, batch: Optional[int], dims: Optional[Mapping[str, int]]) -> None:
        self._spec = spec
        self.name = name
        """How the model was named (a path, ``zoo:NAME``, or ``<NAME: ONNX bytes>``)."""
        self.batch = batch
        """The batch size methods use when not given one (``None``: as exported)."""
        self.dims = dict(dims or {})
        """Sizes of named symbolic dimensions."""
        self._onnx: Optional[bytes] = None
        self._runners: Dict[Tuple[str, str], Any] = {}
        self._ports: Optional[Dict[str, Any]] = None
        # PyTorch's trained parameters (from_torch(train=True)): the step's
        # trainable names unless the caller chooses.
        self._trainable: Optional[List[str]] = None

    def __repr__(self) -> str:
        b = f", batch={self.batch}" if self.batch is not None else ""
        d = f", dims={self.dims}" if self.dims else ""
        return f"smelt.Model({self.name!r}{b}{d})"

    def _options(self, batch: Optional[int] = None, dims: Optional[Mapping[str, int]] = None, sized: bool = True, **options: Any) -> Dict[str, Any]:
        """The library's options for the model (its ``smelt::spec``):
        ``options`` by their names there (``train`` is the optimizer,
        ``trainable`` names or a file of them); ``sized=False`` leaves out
        the batch and the dimensions (a recipe fixes them)."""
        batch = (self.batch if batch is None else batch) if sized else None
        sizes = dict(self.dims) if sized else {}
        sizes.update(dims or {})
        if "train" in options:
            options["optimizer"] = options.pop("train")
        trainable = options.pop("trainable", None)
        if isinstance(trainable, (str, os.PathLike)):
            options["trainable_file"] = os.fspath(trainable)
        elif trainable is not None:
            options["trainable"] = list(trainable)
        elif options.get("optimizer") and self._trainable is not None and not options.get("train_only"):
            options["trainable"] = list(self._trainable)
        out = {"model": self._spec, "batch": batch, "dims": sizes}
        out.update({k: v for k, v in options.items() if v is not None})
        return out

    def _check(self) -> None:
        ins, outs = _smelt.ports(self._options())
        self._ports = {
            "inputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in ins],
            "outputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in outs],
        }

    def _rename(self, d: Dict[str, Any]) -> Dict[str, Any]:
        if d.get("model") == self._spec:
            d["model"] = self.name
        return d

    def _title(self, command: str, batch: Optional[int], extra: str = "") -> str:
        b = self.batch if batch is None else batch
        return f"smelt {command} {self.name}" + (f" --batch {b}" if b is not None else "") + extra

    @property
    def inputs(self) -> List[Dict[str, Any]]:
        """The graph inputs: name, dtype (``f32``, ``i64``...) and shape, at the model's batch."""
        assert self._ports is not None
        return self._ports["inputs"]

    @property
    def outputs(self) -> List[Dict[str, Any]]:
        """The graph outputs: name, dtype and shape."""
        assert self._ports is not None
        return self._ports["outputs"]

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the ONNX bytes a model from :func:`from_torch` or bytes was loaded from."""
        if self._onnx is None:
            raise UsageError(f"{self.name} was loaded from a file or the zoo: it has no ONNX bytes of its own to save")
        with open(path, "wb") as f:
            f.write(self._onnx)

    def text(self, batch: Optional[int] = None) -> str:
        """The model in smelt's text IR, as imported (``smelt print``)."""
        return _smelt.text(self._options(batch))

    def inspect(
        self,
        batch: Optional[int] = None,
        dims: Optional[Mapping[str, int]] = None,
        precision: str = "f32",
        fuse: bool = True,
    ) -> "Inspection":
        """Ops before and kernels after fusion, parameter bytes, naive
        activation bytes, inputs and outputs (``smelt inspect``)."""
        options = self._options(batch, dims, precision=precision, no_fuse=not fuse)
        doc = json.loads(_smelt.inspect(options))
        doc["model"] = self.name
        return Inspection(doc)

    def plan(
        self,
        batch: Optional[int] = None,
        dims: Optional[Mapping[str, int]] = None,
        precision: str = "f32",
        keep_f32: Sequence[str] = (),
        fuse: bool = True,
        memory_limit: Optional[Size] = None,
        min_memory: bool = False,
        train: Optional[str] = None,
        accumulate: int = 1,
        remat_budget: Optional[Size] = None,
        remat_solver: str = "greedy",
        device: str = "h100",
        **training: Any,
    ) -> "Plan":
        """The checked memory plan (``smelt plan``).

        ``precision``: ``f32``, ``f16``, ``bf16``, ``mixed-f16`` or
        ``mixed-bf16`` (``keep_f32`` patterns stay f32). ``train``:
        ``"sgd"``, ``"adam"`` or ``"adamw"`` plans a whole training step
        (forward, loss, backward, update), with ``accumulate`` micro-batches
        of ``batch / accumulate`` and recomputation down to
        ``remat_budget``; other training options (``loss``, ``lr``,
        ``freeze``, ``batch_norm``...) as the CLI's flags. An inference
        plan over ``memory_limit`` is split (segments run by slices of the
        batch or bands of rows) until it fits; ``min_memory=True`` splits
        for the smallest arena (see :attr:`Plan.split`). When nothing fits
        it raises :class:`MemoryLimitError` with the advice and the plan
        attached.
        """
        _check_training(training, "plan")
        limit = None if memory_limit is None else parse_size(memory_limit)
        if train is None and (accumulate != 1 or remat_budget is not None or training):
            raise UsageError("accumulate, remat_budget and the training options need train='sgd', 'adam' or 'adamw'")
        step = {}
        if train is not None:
            step = dict(
                train=train,
                accumulate=accumulate if accumulate != 1 else None,
                remat_budget=None if remat_budget is None else parse_size(remat_budget),
                remat_solver=remat_solver if remat_solver != "greedy" else None,
                device=device if device != "h100" else None,
                **training,
            )
        options = self._options(batch, dims, precision=precision, keep_f32=list(keep_f32), no_fuse=not fuse, min_memory=min_memory, **step)
        extra = f" --train {train}" if train else ""
        try:
            doc, svg, notes = _smelt.plan(options, self._title("plan", batch, extra), limit)
        except MemoryLimitError as e:
            if getattr(e, "plan_json", None) is not None:
                e.plan = Plan(self._rename(json.loads(e.plan_json)), e.svg)
            raise
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return Plan(self._rename(json.loads(doc)), svg)

    def fit(
        self,
        memory_limit: Size,
        batch: Optional[int] = None,
        train: str = "adam",
        precision: str = "f32",
        dims: Optional[Mapping[str, int]] = None,
        keep_f32: Sequence[str] = (),
        gpus: int = 1,
        shard: str = "none",
        remat_solver: str = "greedy",
        device: str = "h100",
        save_recipe: Optional[Union[str, "os.PathLike[str]"]] = None,
        **training: Any,
    ) -> "Fit":
        """The fastest training recipe under ``memory_limit`` (``smelt fit``):
        micro-batch and accumulation, precision (``"auto"`` tries f32,
        mixed-bf16 and mixed-f16) and recomputation, timed on ``device``'s
        roofline. ``batch`` is the whole batch of an optimizer step.
        When nothing fits, raises :class:`MemoryLimitError` with the search
        attached as ``fit``. ``save_recipe`` writes the recipe for
        ``smelt train --recipe``.
        """
        _check_training(training, "fit")
        b = self.batch if batch is None else batch
        if b is None:
            raise UsageError("fit needs batch=: the whole batch of an optimizer step")
        options = self._options(
            b,
            dims,
            memory_limit=parse_size(memory_limit),
            train=train,
            precision=precision,
            keep_f32=list(keep_f32),
            gpus=gpus if gpus != 1 else None,
            shard=shard if shard != "none" else None,
            remat_solver=remat_solver if remat_solver != "greedy" else None,
            device=device if device != "h100" else None,
            **training,
        )
        doc, nothing = _smelt.fit(options)
        result = Fit(self._rename(json.loads(doc)))
        if nothing is not None:
            smallest = (result.to_dict().get("smallest") or {}).get("total_bytes")
            e = MemoryLimitError(nothing, limit=parse_size(memory_limit), arena=smallest)
            e.fit = result
            raise e
        if save_recipe is not None:
            with open(save_recipe, "w") as f:
                f.write(json.dumps(result.recipe, indent=2) + "\n")
        return result

    def compile(
        self,
        out_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        batch: Optional[int] = None,
        dims: Optional[Mapping[str, int]] = None,
        precision: str = "f32",
        fuse: bool = True,
        arch: Optional[str] = None,
        weights: bool = False,
        jobs: Optional[int] = None,
        progress: bool = True,
    ) -> "Build":
        """Generates CUDA C for every kernel and compiles it with NVRTC
        (``smelt compile --out``), cached on disk. With ``out_dir``, writes
        ``kernels/*.cu``, ``kernels/*.ptx``, ``plan.json``, ``memory.json``,
        ``memory.svg`` and with ``weights`` ``weights.bin``. NVRTC is loaded
        at run time (the PyPI wheel ``nvidia-cuda-nvrtc-cu12`` on
        ``LD_LIBRARY_PATH``, its headers in ``SMELT_CUDA_INCLUDE``). The GIL
        is released while it works; ``progress`` shows a bar on standard
        error (tqdm's, in a notebook too, when tqdm is installed).
        """
        options = self._options(batch, dims, precision=precision, no_fuse=not fuse)
        bar = _Progress("compiling kernels") if progress else None
        try:
            out = None if out_dir is None else os.fspath(out_dir)
            doc = _smelt.compile(options, out, self._title("compile", batch), arch, weights, jobs, bar)
        finally:
            if bar is not None:
                bar.close()
        return Build(self._rename(json.loads(doc)))

    def train(
        self,
        data: Union[str, "os.PathLike[str]", Mapping[str, Any]],
        optimizer: str = "adam",
        batch: Optional[int] = None,
        steps: Optional[int] = None,
        epochs: Optional[int] = None,
        val: Optional[Union[str, "os.PathLike[str]", Mapping[str, Any]]] = None,
        backend: str = "cpu",
        dims: Optional[Mapping[str, int]] = None,
        precision: str = "f32",
        keep_f32: Sequence[str] = (),
        tf32: Optional[str] = None,
        fuse: bool = True,
        accumulate: int = 1,
        remat_budget: Optional[Size] = None,
        memory_limit: Optional[Size] = None,
        save: Optional[Union[str, "os.PathLike[str]"]] = None,
        checkpoint: Optional[Union[str, "os.PathLike[str]"]] = None,
        every: Optional[int] = None,
        resume: Optional[Union[str, "os.PathLike[str]"]] = None,
        seed: int = 0,
        shuffle: bool = True,
        recipe: Optional[Union[str, "os.PathLike[str]"]] = None,
        log_json: Optional[Union[str, "os.PathLike[str]"]] = None,
        progress: bool = True,
        **training: Any,
    ) -> "Training":
        """Trains the model (``smelt train``): the compiled training step
        (forward, loss, backward, ``optimizer``'s update) run on the batches
        of ``data`` on ``backend`` (``"cpu"``: the kernels' descriptions,
        ``"emulator"``: their CUDA C on the CPU, ``"cuda"``: GPU 0).

        ``data`` (and ``val``): an ``.npz`` path, ``"synthetic[:N]"``, or a
        dict of arrays by input name (``x`` for a model's only input, ``y``
        the labels). ``steps`` or ``epochs`` (default one epoch), ``seed``
        and ``shuffle`` give the order; ``save`` writes the ONNX model with
        the trained weights; ``checkpoint`` keeps a checkpoint every
        ``every`` steps and at the end, ``resume`` continues from one;
        ``recipe`` takes batch, accumulation, precision and recomputation
        from :meth:`fit`'s. ``tf32`` (``"conv"``, ``"on"``, ``"off"``) as
        the CLI's ``--tf32``: off on the CPU, ``"conv"`` on the emulator and
        CUDA unless given. The other training options (``lr``, ``loss``,
        ``momentum``, ``weight_decay``, ``freeze``, ``clip_norm``...) are
        the CLI's flags. The GIL is released while it trains; ``progress``
        shows a bar (tqdm's when installed).
        """
        _check_training(training, "train")
        held: List[str] = []

        def path(d: Any, what: str) -> Optional[str]:
            if d is None or isinstance(d, (str, os.PathLike)):
                return None if d is None else os.fspath(d)
            if not isinstance(d, Mapping):
                raise UsageError(f"{what} must be an .npz path, 'synthetic[:N]' or a dict of arrays by input name")
            fd, p = tempfile.mkstemp(prefix="smelt-", suffix=".npz")
            os.close(fd)
            np.savez(p, **{k: np.asarray(v) for k, v in d.items()})
            held.append(p)
            return p

        step = dict(
            train=optimizer,
            accumulate=accumulate if accumulate != 1 else None,
            remat_budget=None if remat_budget is None else parse_size(remat_budget),
            recipe=None if recipe is None else os.fspath(recipe),
            **training,
        )
        flags = dict(precision=precision if precision != "f32" else None, keep_f32=list(keep_f32), tf32=tf32, no_fuse=not fuse, **step)
        if recipe is not None:
            flags.pop("precision")
        if recipe is not None and (batch is not None or dims):
            raise UsageError("the recipe fixes the batch and the dimensions: leave out batch= and dims=")
        options = self._options(batch, dims, sized=recipe is None, **flags)
        bar = _Progress("training") if progress else None
        try:
            doc, notes = _smelt.train(
                options,
                path(data, "data"),
                backend,
                path(val, "val"),
                steps,
                epochs,
                None if memory_limit is None else parse_size(memory_limit),
                None if save is None else os.fspath(save),
                None if checkpoint is None else os.fspath(checkpoint),
                every,
                None if resume is None else os.fspath(resume),
                seed,
                shuffle,
                None if log_json is None else os.fspath(log_json),
                None if bar is None else (lambda done, total, loss: bar(done, total, f"loss {loss:.4f}")),
            )
        finally:
            if bar is not None:
                bar.close()
            for p in held:
                _remove(p)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return Training(dict(json.loads(doc), model=self.name))

    def run(
        self,
        inputs: Union[np.ndarray, Sequence[Any], Mapping[str, Any]],
        precision: str = "f32",
        dims: Optional[Mapping[str, int]] = None,
        fuse: bool = True,
        backend: str = "cpu",
    ) -> Dict[str, np.ndarray]:
        """Runs the compiled model and returns its outputs by name, as numpy
        arrays: on the CPU reference executor (``backend="cpu"``), or as the
        program ``smelt run --backend`` runs, on the ``"emulator"`` (the
        generated CUDA C on the CPU) or ``"cuda"`` (GPU 0; TF32 convolutions
        there, as PyTorch's default).

        ``inputs``: an array (a model with one input), a sequence in the
        model's input order, or a dict by input name. Arrays are converted to
        the input's dtype (same kind only) and read in place when they are
        already C-contiguous of that dtype. A batch other than the model's
        (the first axis of every input) compiles the model at that batch;
        compiled models are kept for the next call.
        """
        first = self._runner(self.batch, dims, precision, fuse, backend)
        arrays = self._arrange(first.inputs(), inputs)
        batch = self._batch_of(first.inputs(), arrays)
        runner = first if batch is None else self._runner(batch, dims, precision, fuse, backend)
        ports = runner.inputs()
        held = []
        for (name, dtype, shape), a in zip(ports, arrays):
            want = _NUMPY.get(dtype)
            if want is None:
                raise UnsupportedError(f'input "{name}" is {dtype}: numpy has no such dtype')
            try:
                a = np.ascontiguousarray(np.asarray(a).astype(np.dtype(want).newbyteorder("<"), casting="same_kind", copy=False))
            except TypeError as e:
                raise UsageError(f'input "{name}" is {dtype}{list(shape)}: {e}') from None
            if list(a.shape) != list(shape):
                raise UsageError(f'input "{name}" must have shape {list(shape)} ({dtype}), not {list(a.shape)}')
            held.append(a)
        outs = runner.run([(a.ctypes.data, a.nbytes) for a in held])
        return {name: np.frombuffer(buf, dtype=_NUMPY[dtype]).reshape(shape) for name, dtype, shape, buf in outs}

    def _runner(self, batch: Optional[int], dims: Optional[Mapping[str, int]], precision: str, fuse: bool, backend: str = "cpu") -> Any:
        options = self._options(batch, dims, precision=precision, no_fuse=not fuse)
        key = (json.dumps(options, sort_keys=True), backend)
        if key not in self._runners:
            self._runners[key] = _smelt.Runner(options, backend)
        return self._runners[key]

    @staticmethod
    def _arrange(ports: List[Tuple[str, str, List[int]]], inputs: Any) -> List[Any]:
        names = [p[0] for p in ports]
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            extra = [k for k in inputs if k not in names]
            if missing or extra:
                raise UsageError(f"the model's inputs are {names}; missing {missing}, unknown {extra}")
            return [inputs[n] for n in names]
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != len(names):
                raise UsageError(f"the model takes {len(names)} inputs {names} but {len(inputs)} were given")
            return list(inputs)
        if len(names) != 1:
            raise UsageError(f"the model takes {len(names)} inputs {names}: give a list or a dict by name")
        return [inputs]

    def _batch_of(self, ports: List[Tuple[str, str, List[int]]], arrays: List[Any]) -> Optional[int]:
        """The batch the arrays have when it differs from the compiled one
        and only the first axis differs; otherwise ``None``."""
        if self._spec.endswith(".tir"):
            return None
        firsts = set()
        for (_, _, shape), a in zip(ports, arrays):
            s = list(np.shape(a))
            if len(s) != len(shape) or not shape:
                return None
            if s[1:] != list(shape[1:]):
                return None
            firsts.add(s[0])
        if len(firsts) == 1:
            b = firsts.pop()
            if b != ports[0][2][0] and b >= 1:
                return b
        return None


# ---------------------------------------------------------------- results


class _Result:
    """A result: the CLI's JSON (:meth:`to_dict`) with attributes for its main figures."""

    def __init__(self, doc: Dict[str, Any]) -> None:
        self._doc = doc

    def to_dict(self) -> Dict[str, Any]:
        """What the CLI's ``--json`` prints (a fresh copy)."""
        return json.loads(json.dumps(self._doc))

    def __repr__(self) -> str:
        return f"<smelt.{type(self).__name__} {self._summary()}>"

    def _summary(self) -> str:
        return self._doc.get("model", "")

    def _repr_html_(self) -> str:
        return _table(self._rows(), f"smelt.{type(self).__name__}: {self._summary()}")

    def _rows(self) -> List[Tuple[str, str]]:
        return []


def _table(rows: Iterable[Tuple[str, str]], caption: str, head: Optional[Sequence[str]] = None) -> str:
    esc = html.escape
    out = [f'<table class="smelt"><caption style="text-align:left"><b>{esc(caption)}</b></caption>']
    if head:
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td style="text-align:{"left" if i == 0 else "right"}">{esc(str(c))}</td>' for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "".join(out)


class Inspection(_Result):
    """What :meth:`Model.inspect` found (``smelt inspect --json``)."""

    @property
    def ops(self) -> int:
        """Ops of the model as imported."""
        return self._doc["ops"]

    @property
    def kernels(self) -> int:
        """Kernels after fusion."""
        return self._doc["kernels"]

    @property
    def parameter_bytes(self) -> int:
        """Bytes of the weights."""
        return self._doc["parameter_bytes"]

    @property
    def naive_activation_bytes(self) -> int:
        """Every activation in its own buffer."""
        return self._doc["naive_activation_bytes"]

    @property
    def op_histogram(self) -> Dict[str, int]:
        """Ops by type, before fusion."""
        return dict(self._doc["op_histogram"])

    @property
    def kernel_histogram(self) -> Dict[str, int]:
        """Kernels by type, after fusion."""
        return dict(self._doc["kernel_histogram"])

    @property
    def inputs(self) -> List[Dict[str, Any]]:
        """Name, dtype and shape of each input."""
        return self.to_dict()["inputs"]

    @property
    def outputs(self) -> List[Dict[str, Any]]:
        """Name, dtype and shape of each output."""
        return self.to_dict()["outputs"]

    def _summary(self) -> str:
        return f"{self._doc.get('model', '')}: {self.ops} ops, {self.kernels} kernels"

    def _rows(self) -> List[Tuple[str, str]]:
        rows = [(f"input {p['name']}", f"{p['dtype']}{p['shape']}") for p in self.inputs]
        rows += [(f"output {p['name']}", f"{p['dtype']}{p['shape']}") for p in self.outputs]
        rows += [("parameters", human_bytes(self.parameter_bytes)), ("naive activations", human_bytes(self.naive_activation_bytes))]
        rows += [("ops before fusion", str(self.ops)), ("kernels after fusion", str(self.kernels))]
        rows += [(f"  {k}", str(v)) for k, v in sorted(self.kernel_histogram.items(), key=lambda kv: -kv[1])]
        return rows


class Peak:
    """The step where live bytes peak, and the largest tensors live there."""

    def __init__(self, step: int, node: str, live: List[Dict[str, Any]]) -> None:
        self.step = step
        """The step (position in the schedule)."""
        self.node = node
        """The node run there."""
        self.live = live
        """The largest tensors live there: ``name``, ``bytes``, ``ty``."""

    def __repr__(self) -> str:
        return f"Peak(step={self.step}, node={self.node!r}, live={len(self.live)} tensors)"


class Plan(_Result):
    """A checked memory plan (:meth:`Model.plan`; ``smelt plan --json``).

    Sizes are bytes. The arena holds every activation, graph inputs and
    outputs included; weights are separate.
    """

    def __init__(self, doc: Dict[str, Any], svg: str) -> None:
        super().__init__(doc)
        self._svg = svg

    @property
    def arena_bytes(self) -> int:
        """The one allocation that holds every activation."""
        return self._doc["plan"]["arena_bytes"]

    @property
    def lower_bound_bytes(self) -> int:
        """Live bytes at the peak of the chosen schedule: no arena of it is smaller."""
        return self._doc["plan"]["lower_bound_bytes"]

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weights (outside the arena)."""
        return self._doc["plan"]["weights_bytes"]

    @property
    def naive_activation_bytes(self) -> int:
        """Every activation in its own buffer."""
        return self._doc["plan"]["naive_activation_bytes"]

    @property
    def kernels(self) -> int:
        """Kernels launched."""
        return self._doc["plan"]["kernels"]

    @property
    def checked(self) -> bool:
        """Whether the independent checker accepted the plan (always, or smelt raises)."""
        return self._doc["plan"]["checked"]

    @property
    def peak(self) -> Peak:
        """Where live bytes peak and what is live there."""
        p = self._doc["plan"]
        return Peak(p["peak_step"], p["peak_node"], [dict(t) for t in p["peak_live"]])

    @property
    def split(self) -> Optional[Dict[str, Any]]:
        """What split execution did (``memory_limit`` below the whole-op plan,
        or ``min_memory``): arena before and after, the FLOPs it adds, and
        each split (``how``: ``batch`` or ``rows``, ``parts``, its nodes);
        ``None`` when nothing was split."""
        return self.to_dict()["split"]

    @property
    def training(self) -> Optional[Dict[str, Any]]:
        """For a training step: where its bytes go, in detail (``None`` otherwise)."""
        return self.to_dict()["training"]

    @property
    def total_bytes(self) -> int:
        """Device memory in all: weights (and a step's state) plus the arena."""
        t = self._doc.get("training")
        return t["total_bytes"] if t else self.weights_bytes + self.arena_bytes

    @property
    def breakdown(self) -> Dict[str, int]:
        """Where the bytes go. Inference: ``weights`` and ``activations``
        (the arena). A training step: ``parameters``, ``optimizer_state``,
        ``accumulators``, ``frozen``, ``other_state`` (outside the arena) and
        ``activations`` (the arena), which at its peak holds
        ``saved_activations``, ``gradients``, ``recomputed``,
        ``temporaries`` and ``batch``."""
        t = self._doc.get("training")
        if not t:
            return {"weights": self.weights_bytes, "activations": self.arena_bytes}
        keys = ("parameters", "optimizer_state", "accumulators", "frozen", "other_state")
        peak = ("saved_activations", "gradients", "recomputed", "temporaries", "batch")
        d = {k: t[k]["bytes"] for k in keys}
        d["activations"] = t["arena_bytes"]
        d.update({k: t[k]["bytes"] for k in peak})
        return d

    def svg(self) -> str:
        """The picture (``smelt plan --svg``): live bytes per step with and
        without fusion, and the arena's layout, the peak marked."""
        return self._svg

    def save_svg(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes :meth:`svg` to ``path``."""
        with open(path, "w") as f:
            f.write(self._svg)

    def _summary(self) -> str:
        return f"{self._doc.get('model', '')}: arena {human_bytes(self.arena_bytes)}, lower bound {human_bytes(self.lower_bound_bytes)}"

    def _rows(self) -> List[Tuple[str, str]]:
        p = self._doc["plan"]
        rows = [
            ("weights", human_bytes(p["weights_bytes"])),
            ("naive activations", human_bytes(p["naive_activation_bytes"])),
            ("lower bound (live bytes at peak)", human_bytes(p["lower_bound_bytes"])),
            ("arena", human_bytes(p["arena_bytes"])),
            ("arena / lower bound", f"{p['arena_over_lower_bound']:.4f}"),
            ("kernels", str(p["kernels"])),
            ("schedule", p["schedule"]),
            ("peak", f"step {p['peak_step']} (node {p['peak_node']})"),
        ]
        if self._doc.get("training"):
            rows.append(("where the bytes go", ""))
            rows += [(f"  {k.replace('_', ' ')}", human_bytes(v)) for k, v in self.breakdown.items()]
            rows.append(("total device memory", human_bytes(self.total_bytes)))
        rows.append(("largest tensors live at the peak", ""))
        rows += [(f"  {t['name']} ({t['ty']})", human_bytes(t["bytes"])) for t in p["peak_live"]]
        return rows

    def _repr_html_(self) -> str:
        return f'<div class="smelt-plan">{super()._repr_html_()}<div>{self._svg}</div></div>'


class Fit(_Result):
    """The recipe :meth:`Model.fit` chose and every candidate it tried (``smelt fit --json``)."""

    @property
    def recipe(self) -> Optional[Dict[str, Any]]:
        """The chosen recipe (as ``--save-recipe`` writes it), or ``None``."""
        return self.to_dict()["recipe"]

    @property
    def micro_batch(self) -> int:
        """Samples per micro-step."""
        return self._doc["recipe"]["micro_batch"]

    @property
    def accumulate(self) -> int:
        """Micro-steps per optimizer step."""
        return self._doc["recipe"]["accumulate"]

    @property
    def precision(self) -> str:
        """The precision policy chosen."""
        return self._doc["recipe"]["precision"]

    @property
    def total_bytes(self) -> int:
        """Predicted device memory: arena plus weights and state."""
        return self._doc["recipe"]["predicted"]["total_bytes"]

    @property
    def step_seconds(self) -> float:
        """Predicted seconds per optimizer step on the roofline."""
        return self._doc["recipe"]["predicted"]["step_seconds"]

    @property
    def candidates(self) -> List[Dict[str, Any]]:
        """Every recipe tried, with its verdict."""
        return self.to_dict()["candidates"]

    def _summary(self) -> str:
        if not self._doc.get("recipe"):
            return f"{self._doc.get('model', '')}: nothing fits"
        return f"{self._doc.get('model', '')}: {self.precision}, micro-batch {self.micro_batch} x {self.accumulate}, {human_bytes(self.total_bytes)}"

    def _rows(self) -> List[Tuple[str, str]]:
        r = self._doc.get("recipe")
        if not r:
            return [("nothing fits", "")]
        pr = r["predicted"]
        return [
            ("batch", str(r["batch"])),
            ("micro-batch x accumulate", f"{r['micro_batch']} x {r['accumulate']}"),
            ("precision", r["precision"]),
            ("recomputation budget", "none" if r["remat_budget"] is None else human_bytes(r["remat_budget"])),
            ("arena", human_bytes(pr["arena_bytes"])),
            ("weights and state", human_bytes(pr["persistent_bytes"])),
            ("total", human_bytes(pr["total_bytes"])),
            ("step (roofline estimate)", f"{pr['step_seconds'] * 1e3:.2f} ms"),
            ("recomputed kernels", str(pr["recomputed"])),
            ("candidates tried", str(len(self._doc["candidates"]))),
        ]


class Build(_Result):
    """What :meth:`Model.compile` made (``smelt compile --out DIR --json``)."""

    @property
    def kernels(self) -> int:
        """Kernel launches in the program."""
        return self._doc["kernels"]

    @property
    def distinct_kernels(self) -> int:
        """Distinct kernels compiled."""
        return self._doc["distinct_kernels"]

    @property
    def from_cache(self) -> int:
        """Kernels that came from the disk cache."""
        return self._doc["from_cache"]

    @property
    def arena_bytes(self) -> int:
        """The program's arena."""
        return self._doc["arena_bytes"]

    @property
    def out_dir(self) -> Optional[str]:
        """Where it was written, if anywhere."""
        return self._doc["out"]

    def _summary(self) -> str:
        return f"{self._doc.get('model', '')}: {self.kernels} launches, {self.distinct_kernels} kernels ({self.from_cache} cached)"

    def _rows(self) -> List[Tuple[str, str]]:
        d = self._doc
        return [
            ("arch", d["arch"]),
            ("kernel launches", str(d["kernels"])),
            ("distinct kernels", str(d["distinct_kernels"])),
            ("from the cache", str(d["from_cache"])),
            ("compile seconds", f"{d['compile_seconds']:.2f}"),
            ("arena", human_bytes(d["arena_bytes"])),
            ("weights", human_bytes(d["weights_bytes"])),
            ("written to", d["out"] or "-"),
        ]


class Training(_Result):
    """What :meth:`Model.train` did: ``smelt train --json``."""

    @property
    def steps(self) -> int:
        """Steps in all (counted from the start when resumed)."""
        return self._doc["steps"]

    @property
    def first_loss(self) -> Optional[float]:
        """The first step's loss."""
        return self._doc["first_loss"]

    @property
    def final_loss(self) -> Optional[float]:
        """The last step's loss."""
        return self._doc["final_loss"]

    @property
    def validation(self) -> Optional[Dict[str, Any]]:
        """The final validation pass (loss, accuracy, samples), with ``val``."""
        return self._doc["validation"]

    @property
    def seconds(self) -> float:
        """Wall time of the steps."""
        return self._doc["seconds"]

    @property
    def device_bytes(self) -> int:
        """Device memory: activation arena plus weights and optimizer state."""
        return self._doc["device_bytes"]

    def _summary(self) -> str:
        loss = self._doc["final_loss"]
        return f"{self._doc['model']}: {self._doc['steps_run']} steps on {self._doc['device']}" + (f", loss {loss:.4f}" if loss is not None else "")

    def _rows(self) -> List[Tuple[str, str]]:
        d = self._doc
        rows = [
            ("device", d["device"]),
            ("steps", f"{d['steps_run']} ({d['resumed_from']} to {d['steps']})"),
            ("batch", str(d["batch"]) + (f" ({d['accumulate']} micro-batches)" if d["accumulate"] > 1 else "")),
            ("loss", f"{d['first_loss']:.4f} -> {d['final_loss']:.4f}" if d["final_loss"] is not None else "-"),
            ("ms per step", f"{d['ms_per_step']:.2f}"),
            ("device memory", human_bytes(d["device_bytes"])),
        ]
        if d.get("validation"):
            v = d["validation"]
            rows.append(("validation loss", f"{v['loss']:.4f}" + (f", accuracy {100 * v['accuracy']:.2f}%" if v.get("accuracy") is not None else "")))
        if d.get("saved"):
            rows.append(("saved to", d["saved"]))
        return rows


# ---------------------------------------------------------------- progress


class _Progress:
    """A progress bar for a native call (called back from its threads):
    tqdm's when it is installed (it draws in notebooks too), else one line
    rewritten on standard error."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.bar: Any = None
        self.drawn = False

    def __call__(self, done: int, total: int, name: str) -> None:
        if self.bar is None:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=self.what, leave=False)
            except ImportError:
                self.bar = False
        if self.bar:
            self.bar.update(done - self.bar.n)
            self.bar.set_postfix_str(name, refresh=False)
        else:
            sys.stderr.write(f"\r{self.what} {done}/{total} {name[:40]:<40}")
            sys.stderr.flush()
            self.drawn = True

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        elif self.drawn:
            sys.stderr.write("\r" + " " * 80 + "\r")
            sys.stderr.flush()
