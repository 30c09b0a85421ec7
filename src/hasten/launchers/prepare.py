"""Per-process preparation for launched functions, and the check that a launch can start state.

`PrepareForLaunch` wraps a function for spawners that pass the process index first
(``torch.multiprocessing.start_processes``, torch_xla's ``spawn``): it publishes the rank
variables torchrun would set, or joins the debug launcher's file rendezvous, then calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hasten.config import envvars
from hasten.config.enums import DistributedType

__all__ = ["PrepareForLaunch", "env_var_path_add", "test_launch"]


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """Return the ``:``-separated value of `env_var_name` with `path_to_add` appended.

    The environment is not changed; set the result yourself (e.g. in a child's environment).
    """
    current = envvars.read(env_var_name) or ""
    paths = [part for part in current.split(":") if part]
    paths.append(str(path_to_add))
    return ":".join(paths)


class PrepareForLaunch:
    """Wrap `launcher` so each spawned process sets its distributed variables before running it.

    Args:
        launcher: the function to run in every process.
        distributed_type: a `DistributedType` value; the ``MULTI_*`` ones publish ``RANK`` and
            ``LOCAL_RANK`` from the process index (``NPROC`` x ``NODE_RANK`` + index).
        debug: join a gloo group over ``ACCELERATE_DEBUG_RDV_FILE`` (``WORLD_SIZE`` processes).

    Raises:
        ValueError: `distributed_type` is not a `DistributedType` value.
    """

    def __init__(
        self, launcher: Callable[..., Any], distributed_type: Any = "NO", debug: bool = False
    ) -> None:
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> Any:
        """Run the launcher as process `index`; returns what it returns."""
        if self.debug:
            self._join_debug_group(index)
        elif str(self.distributed_type.value).startswith("MULTI_"):
            nproc = envvars.read_int("NPROC", 1) or 1
            node_rank = envvars.read_int("NODE_RANK", 0) or 0
            envvars.write("LOCAL_RANK", index)
            envvars.write("RANK", nproc * node_rank + index)
        envvars.write("FORK_LAUNCHED", 1)
        return self.launcher(*args)

    @staticmethod
    def _join_debug_group(index: int) -> None:
        import torch.distributed as dist  # deferred: imports all of torch

        world_size = envvars.read_int("WORLD_SIZE")
        rdv_file = envvars.read("ACCELERATE_DEBUG_RDV_FILE")
        if world_size is None or not rdv_file:
            raise RuntimeError(
                "PrepareForLaunch(debug=True) needs WORLD_SIZE and ACCELERATE_DEBUG_RDV_FILE in "
                "the environment (the file every process uses for the rendezvous); set both."
            )
        store = dist.FileStore(rdv_file, world_size)
        dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)


def test_launch() -> None:
    """Check that a launched process can build its `PartialState` (process group, device)."""
    from hasten.state import PartialState  # deferred: builds the state only when called

    PartialState()
