"""Type stubs of smelt's native module (python/src/lib.rs).

Each function takes the command line's flags, ``[MODEL, --flag, value,
...]``, as ``smelt/__init__.py`` builds them, and returns what the CLI's
``--json`` prints, as a string. Errors raise :mod:`smelt.errors`.
"""

from typing import Callable, List, Optional, Sequence, Tuple

Port = Tuple[str, str, List[int]]

def inspect(argv: Sequence[str]) -> str: ...
def plan(argv: Sequence[str], title: str, memory_limit: Optional[int] = None) -> Tuple[str, str, List[str]]: ...
def fit(argv: Sequence[str]) -> Tuple[str, Optional[str]]: ...
def compile(
    argv: Sequence[str],
    out_dir: Optional[str],
    title: str,
    arch: Optional[str] = None,
    weights: bool = False,
    jobs: Optional[int] = None,
    progress: Optional[Callable[[int, int, str], None]] = None,
) -> str: ...
def train(
    argv: Sequence[str],
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
def text(argv: Sequence[str]) -> str: ...
def ports(argv: Sequence[str]) -> Tuple[List[Port], List[Port]]: ...
def parse_size(s: str) -> int: ...
def human_bytes(b: int) -> str: ...
def version() -> str: ...

class Runner:
    def __init__(self, argv: Sequence[str], backend: str = "cpu") -> None: ...
    def inputs(self) -> List[Port]: ...
    def outputs(self) -> List[Port]: ...
    def run(self, inputs: Sequence[Tuple[int, int]]) -> List[Tuple[str, str, List[int], bytearray]]: ...
