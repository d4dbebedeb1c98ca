"""Type stubs of smelt's native module (python/src/lib.rs).

Each function takes the model's options as a dict, ``{"model": ...,
"batch": 8, "optimizer": "adam", ...}`` (the fields of the library's
``smelt::spec::ModelSpec`` and ``StepSpec``), as ``smelt/__init__.py``
builds them, and returns what the CLI's ``--json`` prints, as a string. An
unknown option or a value of the wrong type raises ``UsageError``; other
errors raise :mod:`smelt.errors`.
"""

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

Options = Mapping[str, Any]

Port = Tuple[str, str, List[int]]

def inspect(options: Options) -> str: ...
def plan(options: Options, title: str, memory_limit: Optional[int] = None) -> Tuple[str, str, List[str]]: ...
def fit(options: Options) -> Tuple[str, Optional[str]]: ...
def compile(
    options: Options,
    out_dir: Optional[str],
    title: str,
    arch: Optional[str] = None,
    weights: bool = False,
    jobs: Optional[int] = None,
    progress: Optional[Callable[[int, int, str], None]] = None,
) -> str: ...
def train(
    options: Options,
    data: str,
    backend: str = "cpu",
    val: Optional[str] = None,
    steps: Optional[int] = None,
    epochs: Optional[int] = None,
    memory_limit: Optional[int] = None,
    save: Optional[str] = None,
    checkpoint: Optional[str] = None,
    every: Optional[int] = None,
    resume: Optional[str] = None,
    seed: int = 0,
    shuffle: bool = True,
    log_json: Optional[str] = None,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> Tuple[str, List[str]]: ...
def text(options: Options) -> str: ...
def ports(options: Options) -> Tuple[List[Port], List[Port]]: ...
def parse_size(s: str) -> int: ...
def human_bytes(b: int) -> str: ...
def version() -> str: ...

class Runner:
    def __init__(self, options: Options, backend: str = "cpu") -> None: ...
    def inputs(self) -> List[Port]: ...
    def outputs(self) -> List[Port]: ...
    def run(self, inputs: Sequence[Tuple[int, int]]) -> List[Tuple[str, str, List[int], bytearray]]: ...
