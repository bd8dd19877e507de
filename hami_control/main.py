"""Entry point of `hami-control`: load the config, then run the control plane (watch caches, the HTTPS
server with its webhook, health and readiness routes, certificate reloading) on one asyncio loop until
SIGTERM/SIGINT, and stop gracefully (requests in flight finish, then the watches end).

    hami-control [serve] [flags]      # serve is the default command
    hami-control certs [flags]        # the webhook's TLS Secret and caBundle
    hami-control status top|explain|quota [flags]   # read-only, as `kubectl hami` (status/cli.py)

Start-up errors (bad flags or config file, unreadable certificates, no kubeconfig, a port in use) print
one line naming what to fix and exit 2; they never print a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hami_control.admission import admission_handler
from hami_control.binder import Binder
from hami_control.caches import ClusterCaches
from hami_control.certs import CertOptions, bootstrap, certs_options
from hami_control.config import ConfigError, ControlConfig, HelpRequested, KubeSettings, load_config
from hami_control.dra_templates import TemplateKeeper
from hami_control.frag_mix import MixInUse, MixLearner, MixSource
from hami_control.gpu_sinks import InventoryProblems
from hami_control.leader import LEADER_VALUE, LeaderElector, default_identity, extender_gate, label_pod
from hami_control.metrics import ControlMetrics
from hami_control.mix_feed import MixFeed
from hami_control.scheduling import Extender
from hami_control.server import (
    EXTENDER_MAX_BODY,
    AdmissionHandler,
    CertificateError,
    CertificateReloader,
    ControlServer,
    Routes,
    WebhookAnswer,
    extender_routes,
    health_routes,
    metrics_route,
    webhook_route,
)
from hami_control.webhook import CPU_WEBHOOK_PATH, handle_cpu_admission_review
from hami_control.writers import KubeBindingWriter, event_recorder
from hami_kube.client import KubeApi, component_user_agent
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_kube.events import EventRecorder

log = logging.getLogger("hami_control")

EXIT_CONFIG = 2
COMPONENT = "hami-control"
"""The component name in the User-Agent of hami-control's API calls."""
DRA_WEBHOOK_PATH = "/webhook/dra"
"""The webhook entry of the namespaces that opted in to DRA (namespaceSelector hami.io/dra=enabled)."""
COMMANDS = {
    "serve": "run the webhook and the scheduler extender until SIGTERM (default)",
    "certs": "create or renew the webhook's TLS Secret and caBundle (the install Job runs it)",
    "status": "what hami-control sees of a cluster: top, explain pod NAME, quota (as kubectl hami)",
}


class StartupError(Exception):
    """Something the user must fix before the control plane can run (the message says what)."""


class ControlPlane:
    """Every long-lived part of hami-control: `await start()`, then `await stop()`. `routes` may be
    extended before `start()` (the benchmark adds a no-op route)."""

    def __init__(self, config: ControlConfig) -> None:
        self.config = config
        self.routes = Routes()
        self.reloader: CertificateReloader | None = None
        self.api: KubeApi | None = None
        self.caches: ClusterCaches | None = None
        self.templates: TemplateKeeper | None = None
        self.extender: Extender | None = None
        self.binder: Binder | None = None
        self.events: EventRecorder | None = None
        self.metrics: ControlMetrics | None = None
        self.elector: LeaderElector | None = None
        self.server: ControlServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def port(self) -> int:
        return self.server.port if self.server is not None else 0

    async def start(self) -> None:
        """Build and start every part; raises `StartupError` (after undoing what was started)."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        config = self.config
        if not config.server.insecure_http:
            assert config.server.tls_cert_file is not None and config.server.tls_key_file is not None
            self.reloader = CertificateReloader(config.server.tls_cert_file, config.server.tls_key_file)
            try:
                self.reloader.load()
            except CertificateError as exc:
                raise StartupError(str(exc)) from None
        try:
            kube = config.kube
            self.api = await KubeApi.connect(
                kube.kubeconfig,
                environ=kube.environ,
                qps=kube.qps,
                burst=kube.burst,
                user_agent=component_user_agent(COMPONENT),
            )
        except KubeConfigError as exc:
            raise StartupError(str(exc)) from None
        self.caches = caches = ClusterCaches(self.api, config, freeze_when_synced=True)
        self._wire_extender(self.api, caches)
        if self.reloader is not None and self.metrics is not None:
            reloader = self.reloader

            def expiry() -> float | None:
                current = reloader.current
                return None if current is None else current.not_after.timestamp()

            self.metrics.watch_certificate(expiry)
        caches.start()
        health_routes(self.routes, caches.readiness)
        if caches.templates is not None:
            self.templates = TemplateKeeper(
                self.api, caches.templates, timeout_s=config.dra.template_timeout_s
            )
        # With draTranslation "all" the first entry translates too, so both routes keep templates.
        admit: AdmissionHandler = admission_handler(
            config, caches.quota_view, self.metrics, templates=self.templates
        )
        webhook_route(self.routes, admit, max_body=config.server.max_request_body)
        admit_dra = admission_handler(
            config, caches.quota_view, self.metrics, dra_route=True, templates=self.templates
        )
        webhook_route(self.routes, admit_dra, max_body=config.server.max_request_body, path=DRA_WEBHOOK_PATH)

        def admit_cpu(body: bytes) -> WebhookAnswer:
            """The fragmentation component's cpu.hami.io entry: pods that ask no GPU, steered to
            hami-scheduler under its settings (webhook.review_cpu_pod), else allowed untouched."""
            result = handle_cpu_admission_review(body, config)
            return WebhookAnswer(
                result.status, result.body, result.summary.fields(), result.summary.exception
            )

        webhook_route(self.routes, admit_cpu, max_body=config.server.max_request_body, path=CPU_WEBHOOK_PATH)
        self.server = ControlServer(
            self.routes,
            config.server.bind.host,
            config.server.bind.port,
            ssl_context=self.reloader.context if self.reloader is not None else None,
            max_body=max(config.server.max_request_body, EXTENDER_MAX_BODY),
            limits=config.server.connection_limits,
        )
        if self.metrics is not None:
            server = self.server
            self.metrics.watch_connections(lambda: server.stats, server.limits)
        try:
            await self.server.start()
        except OSError as exc:
            self.server = None
            why = exc.strerror or exc
            raise StartupError(f"cannot listen on {config.server.bind} (--bind): {why}") from None
        if self.reloader is not None:
            self._tasks.append(asyncio.create_task(self.reloader.run(), name="certificate-reloader"))
        # Everything loaded so far (the kubernetes package alone is ~700 modules) lives as long as the
        # process: move it out of the garbage collector's reach so full collections, which pause the
        # loop, only walk what was allocated since (not measured to matter on the noisy dev VM).
        # Once the first lists are in, the cached objects (hundreds of thousands at 50,000 pods) live long:
        # the caches freeze them too when they have synced (`freeze_when_synced`), so a full collection
        # (~220 ms over them) never pauses the loop in the middle of a filter.
        gc.freeze()

    def _wire_extender(self, api: KubeApi, caches: ClusterCaches) -> None:
        """The scheduler extender on the watch-fed GPU cache: filter/prioritize, the binder (bindings,
        its pending window fed by pod and node events, the sweeper), events and metrics."""
        config = self.config
        self.events = events = event_recorder(api, config.kube.pod_name)
        events.start()
        configured = MixInUse(config.scheduling.configured_mix, MixSource.CONFIGURED)
        self.metrics = metrics = ControlMetrics(caches.gpus, caches.quota_view, fragmentation_mix=configured)

        async def read_pod(namespace: str, name: str) -> dict[str, Any] | None:
            try:
                return await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except KubeApiError as err:
                if err.status == 404:
                    return None
                raise LookupError(f"pod {namespace}/{name}: cannot read it: {err}") from None

        writer = KubeBindingWriter(api)
        self.binder = binder = Binder(
            caches.gpus,
            caches.pods,
            writer,
            events,
            locker=writer,
            node_lock=Extender.node_lock_from(caches.gpu_nodes.locks),
            identifies=caches.gpu_nodes.identifying.__contains__,
            allocate_timeout_s=config.binder.allocate_timeout_s,
            bind_wait_s=config.binder.bind_wait_s,
        )
        self.extender = extender = Extender(
            config,
            caches.gpus,
            caches.pods,
            binder=binder,
            quota=caches.quota_view,
            metrics=metrics,
            events=events,
            read_pod=read_pod,
        )

        caches.pods.add_listener(binder.pod_event)
        caches.pods.add_listener(metrics.allocating.pod_event)
        caches.gpu_nodes.hooks.append(binder.node_changed)
        caches.gpu_nodes.hooks.append(InventoryProblems(caches.gpus, events))
        self._learn_mix(caches, extender, metrics, configured)
        self._tasks.append(asyncio.create_task(binder.run_sweeper(), name="bind-sweeper"))

        if config.election.enabled:
            self._start_election(api, caches, binder)
            elector = self.elector
            assert elector is not None
            metrics.watch_leader(lambda: elector.leading)

        extender_routes(
            self.routes, extender, gate=extender_gate(self.elector, caches.readiness), cpu_verbs=extender
        )

        async def render() -> tuple[bytes, str]:
            snapshot = metrics.snapshot()  # on the loop, where the cache lives; the text in a thread
            return await asyncio.to_thread(metrics.render, snapshot)

        metrics_route(self.routes, render)

    def _learn_mix(
        self, caches: ClusterCaches, extender: Extender, metrics: ControlMetrics, configured: MixInUse
    ) -> None:
        """With `--fragmentation-mix observed`, the fragmentation policies' task mix is learned from the
        pods the pod store sees (frag_mix.py, mix_feed.py) and handed to the extender and the metrics
        when it changes; `configured` (the prior) until then."""
        scheduling = self.config.scheduling
        learning = scheduling.mix_learning
        if learning is None:
            return

        def use(in_use: MixInUse) -> None:
            extender.mix = in_use.mix
            metrics.set_fragmentation_mix(in_use)

        feed = MixFeed(MixLearner(scheduling.configured_mix, learning), caches.gpus, use)
        caches.pods.add_listener(feed.pod_event)
        self._tasks.append(asyncio.create_task(feed.run(), name="fragmentation-mix"))
        log.info(
            "fragmentation policies use the %s until %d GPU tasks were observed",
            configured.text(),
            learning.min_tasks,
        )

    def _start_election(self, api: KubeApi, caches: ClusterCaches, binder: Binder) -> None:
        """Leader election for the extender (leader.py): a new leader relists, adopts the pods still
        being allocated into its pending windows and labels its pod; a deposed one forgets its windows
        and drops the label."""
        config = self.config
        settings = config.election.lease_settings(default_identity(config.kube.pod_name))
        pod_name, pod_namespace = config.kube.pod_name, config.kube.pod_namespace

        async def elected() -> None:
            await caches.resync()
            adopted = binder.adopt_allocating(caches.pods.pods())
            if adopted:
                log.info("took over %d pods still being allocated into the pending windows", adopted)
            await label_pod(api, pod_namespace, pod_name, LEADER_VALUE)

        async def deposed() -> None:
            binder.reset()
            await label_pod(api, pod_namespace, pod_name, None)

        self.elector = LeaderElector(settings, api, on_elected=elected, on_deposed=deposed)
        self._tasks.append(asyncio.create_task(self.elector.run(), name="leader-election"))

    async def stop(self) -> None:
        """Stop serving (requests in flight finish), then the reloader and the watches, then the client."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.elector is not None and self.api is not None:
            await self.elector.release()
        templates, self.templates = self.templates, None
        if templates is not None:
            await templates.stop()
        caches, self.caches = self.caches, None
        if caches is not None:
            await caches.stop()
        events, self.events = self.events, None
        if events is not None:
            await events.stop()
        api, self.api = self.api, None
        if api is not None:
            await api.close()


async def serve(config: ControlConfig, *, ready: Callable[[ControlPlane], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    plane = ControlPlane(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await plane.start()
        except StartupError as exc:
            print(f"hami-control: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        log.info("hami-control running (scheduler name %s)", config.webhook.scheduler_name)
        if ready is not None:
            ready(plane)
        await stop.wait()
        log.info("hami-control stopping")
        await plane.stop()
        log.info("hami-control stopped")
        return 0
    finally:
        for sig in signals:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


def _read_file(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _usage() -> str:
    commands = "\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
    return (
        f"usage: hami-control [COMMAND] [flags]\n\ncommands:\n{commands}\n\n"
        "'hami-control serve --help' lists the flags."
    )


def split_command(args: Sequence[str]) -> tuple[str, list[str]]:
    """(command, its arguments): the first argument when it is not a flag, else `serve`."""
    if args and not args[0].startswith("-"):
        return args[0], list(args[1:])
    return "serve", list(args)


async def _run_certs(options: CertOptions, kube: KubeSettings) -> int:
    try:
        api = await KubeApi.connect(
            kube.kubeconfig, environ=kube.environ, user_agent=component_user_agent(COMPONENT)
        )
    except KubeConfigError as exc:
        print(f"hami-control certs: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        done = await bootstrap(api, options)
    except KubeApiError as exc:
        print(f"hami-control certs: {exc}", file=sys.stderr)
        return 1
    finally:
        await api.close()
    for line in done or [f"Secret {options.namespace}/{options.secret} and caBundles are up to date"]:
        print(f"hami-control certs: {line}")
    return 0


def certs_main(args: Sequence[str]) -> int:
    try:
        options, kube = certs_options(args, os.environ)
    except HelpRequested as help_text:
        print(help_text.text)
        return 0
    except ConfigError as exc:
        print(f"hami-control certs: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_run_certs(options, kube))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = split_command(args)
    if command == "help":
        print(_usage())
        return 0
    if command not in COMMANDS:
        print(f"hami-control: unknown command {command!r}\n{_usage()}", file=sys.stderr)
        return EXIT_CONFIG
    if command == "certs":
        return certs_main(rest)
    if command == "status":
        from hami_control.status.cli import run as status_run

        return status_run(rest, "hami-control status")
    try:
        config = load_config(rest, os.environ, _read_file)
    except HelpRequested as help_text:
        print(help_text.text)
        return 0
    except ConfigError as exc:
        print(f"hami-control: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(
        level=config.log_level.value.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for warning in config.warnings:
        log.warning("%s (ignored)", warning)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
