"""Launch engine: `hasten launch` planning and running, plus the in-Python launchers.

`notebook_launcher` and `debug_launcher` live in `hasten.launchers.notebook`; importing this
package loads no torch (every heavy import is deferred to the call).
"""

from hasten.launchers.notebook import debug_launcher, notebook_launcher

__all__ = ["debug_launcher", "notebook_launcher"]
