"""An in-memory stand-in for kube-apiserver (aiohttp): the REST subset this project uses, with watch,
patch, pods/binding, mutating admission webhooks, discovery for kubectl, and request counters.

`ApiServerRunner` runs it in-process on its own thread; `hami-sim apiserver` (`cli`) runs it as a process.
"""

from hami_sim.apiserver import cli
from hami_sim.apiserver.runner import ApiServerRunner, start_site
from hami_sim.apiserver.server import ApiServer

__all__ = ["ApiServer", "ApiServerRunner", "cli", "start_site"]
