"""The operator commands of ``vcrawl``: ``serve``, ``pause``, ``resume``, ``config``."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from pathlib import Path
from typing import Any

from cli.run import add_network_option, add_run_options, allowing, resume_job_locally, uses_private_redis
from vcrawl.errors import ConfigError, InvalidTask
from vcrawl.jobs import masked_url
from vcrawl.settings import Settings
from vcrawl.targets.clusters import CLUSTER_NAME, DEFAULT_CLUSTER_NAME, cluster_urls

__all__ = ["add_ops_commands", "check_serve_options"]


def add_ops_commands(commands: Any) -> None:
    """Register the operator subcommands on the ``vcrawl`` parser's subparsers."""
    serve = commands.add_parser("serve", help="the job API and dashboard over HTTP (a bearer token is required)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--insecure-local", action="store_true",
                       help="no token: only on a loopback address, for a single-user machine")  # fmt: skip
    serve.add_argument("--cluster", action="append", default=[], metavar="NAME=URL",
                       help="also watch and steer the cluster whose Redis is URL, under /api/clusters/NAME "
                            "(repeat it; $VCRAWL_MONITOR_CLUSTERS adds more)")  # fmt: skip
    serve.add_argument("--name", default=DEFAULT_CLUSTER_NAME,
                       help=f"the name of this server's own cluster ($VCRAWL_REDIS_URL) in the cluster list "
                            f"(default {DEFAULT_CLUSTER_NAME})")  # fmt: skip
    serve.set_defaults(run=_cmd_serve)

    pause = commands.add_parser("pause", help="stop dispatching a job until resumed (in-flight fetches finish)")
    pause.add_argument("job")
    pause.set_defaults(run=_cmd_pause)
    resume = commands.add_parser(
        "resume",
        help="go on with a paused job: on the cluster ($VCRAWL_REDIS_URL), or with the saved state of --data",
        description="With VCRAWL_REDIS_URL set, dispatch a paused job again on the cluster and return. Otherwise "
        "restart the private Redis of DATA (as `vcrawl crawl` left it after Ctrl-C) and local workers, "
        "and run the job to its end with the same progress and summary as `vcrawl crawl`.",
    )
    resume.add_argument("job")
    add_network_option(resume)  # a run's --allow-network is not saved: give it again (the hint shows it)
    add_run_options(resume)
    resume.set_defaults(run=_cmd_resume)

    config = commands.add_parser(
        "config",
        help="change a running job's politeness, header pools or proxies; or the cluster's settings, live",
        description="vcrawl config JOB --interval 1 ...: a running job's own settings. vcrawl config set NAME "
        "VALUE / unset NAME / list [--json]: the cluster's VCRAWL_* settings that may change without a restart "
        "(every worker takes them up within seconds); the others are refused with the reason.",
    )
    config.add_argument("job", metavar="JOB|set|unset|list")
    config.add_argument("setting", nargs="*", metavar="NAME [VALUE]", help="with set/unset: the setting (and value)")
    config.add_argument("--json", action="store_true", help="with list: JSON")
    config.add_argument("--interval", type=float, metavar="S", help="politeness.min_interval_s")
    config.add_argument("--jitter", type=float, help="politeness.jitter")
    config.add_argument("--per-host", type=int, help="politeness.per_host: parallel fetches per host")
    config.add_argument("--user-agents", type=Path, metavar="FILE", help="User-Agents, one per line")
    config.add_argument("--referers", type=Path, metavar="FILE", help="Referers, one per line (empty: none)")
    config.add_argument("--proxies", type=Path, metavar="FILE", help="proxy URLs, one per line (empty: none)")
    config.set_defaults(run=_cmd_config)


def check_serve_options(token: str | None, address: str, insecure_local: bool) -> str | None:
    """The token the server requires (None: no auth), or raise when the options are unsafe.

    >>> check_serve_options("s3cret-token-123", "0.0.0.0", False)
    's3cret-token-123'
    >>> check_serve_options(None, "127.0.0.1", True) is None
    True

    Raises:
        ConfigError: no token without ``--insecure-local``, or ``--insecure-local`` on a
            non-loopback address.
    """
    if insecure_local:
        try:
            loopback = ipaddress.ip_address(address).is_loopback
        except ValueError:
            loopback = address == "localhost"
        if not loopback:
            raise ConfigError(f"--insecure-local serves without a token, so only on a loopback address, not {address}")
        return None
    if not token:
        raise ConfigError("set VCRAWL_API_TOKEN (every /api/ call needs it), or pass --insecure-local")
    if len(token) < 16:
        raise ConfigError("VCRAWL_API_TOKEN must be at least 16 characters")
    return token


def _cmd_serve(args: argparse.Namespace) -> int:
    from api import make_server, real_api

    settings = Settings.from_env()
    token = check_serve_options(settings.api_token, args.address, args.insecure_local)
    if not CLUSTER_NAME.fullmatch(args.name):
        raise ConfigError(f"--name {args.name[:60]!r} must be 1-40 letters, digits, '-' or '_'")
    clusters = cluster_urls([*settings.monitor_clusters, *args.cluster], "--cluster / VCRAWL_MONITOR_CLUSTERS",
                            taken=[args.name])  # fmt: skip
    server = make_server(real_api(token, clusters, args.name), args.address, args.port)
    host, port = server.server_address[:2]
    print(f"vcrawl API and dashboard on http://{host}:{port}/ ({'no token' if token is None else 'bearer token'}; "
          f"clusters: {', '.join([args.name, *clusters])})", file=sys.stderr, flush=True)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _cmd_pause(args: argparse.Namespace) -> int:
    import tasks

    if tasks.pause_job(args.job):
        print(f"job {args.job} paused: nothing more is dispatched until `vcrawl resume {args.job}`")
        return 0
    print(f"vcrawl: job {args.job!r} is not running", file=sys.stderr)
    return 1


def _cmd_resume(args: argparse.Namespace) -> int:
    import tasks

    settings = Settings.from_env()
    if uses_private_redis(settings):
        return resume_job_locally(args.job, allowing(settings, args.allow_network or []), args)

    state = tasks.resume_job(args.job)
    if state is None:
        print(f"vcrawl: job {args.job!r} is not paused", file=sys.stderr)
        return 1
    print(f"job {args.job} {state}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import tasks

    if args.job in _CLUSTER_ACTIONS:
        return _cmd_cluster_config(args)
    if args.setting:
        raise InvalidTask("config", f"a job takes options (--interval ...), not {' '.join(args.setting)!r}")
    changes: dict[str, Any] = {}
    politeness = {key: value for key, value in (("min_interval_s", args.interval), ("jitter", args.jitter),
                                                ("per_host", args.per_host)) if value is not None}  # fmt: skip
    if politeness:
        changes["politeness"] = politeness
    for key in ("user_agents", "referers", "proxies"):
        path = getattr(args, key)
        if path is not None:
            changes[key] = _lines(path, key)
    if not changes:
        raise InvalidTask("config", "give at least one of --interval, --jitter, --per-host, --user-agents, "
                          "--referers, --proxies")  # fmt: skip
    spec = tasks.reconfigure_job(args.job, changes)
    proxies = [masked_url(proxy) for proxy in spec.proxies] if spec.proxies is not None else None
    live = {"politeness": spec.to_dict()["politeness"], "user_agents": spec.user_agents, "referers": spec.referers,
            "proxies": proxies}  # fmt: skip
    print(json.dumps({key: live[key] for key in changes}, sort_keys=True))
    return 0


_CLUSTER_ACTIONS = {"set": 2, "unset": 1, "list": 0}  # words after them


def _cmd_cluster_config(args: argparse.Namespace) -> int:
    import tasks

    action, words = args.job, args.setting
    if len(words) != _CLUSTER_ACTIONS[action]:
        usage = {"set": "set NAME VALUE", "unset": "unset NAME", "list": "list [--json]"}[action]
        raise InvalidTask("config", f"usage: vcrawl config {usage}")
    if action == "list":
        rows = tasks.cluster_settings()
        if args.json:
            print(json.dumps(rows, sort_keys=True))
            return 0
        for row in rows:
            live = "live" if row["live"] else "restart"
            print(f"{row['name']}={json.dumps(row['value'])}  [{row['source']}, {live}]")
        return 0
    if action == "unset":
        removed = tasks.unset_cluster_setting(words[0])
        print(f"{words[0]}: {'cluster value dropped' if removed else 'had no cluster value'}")
        return 0
    try:
        name = tasks.set_cluster_setting(words[0], words[1])
    except InvalidTask as exc:  # not a job's error: say which setting and why
        print(f"vcrawl: config set {words[0]}: {exc.problem}", file=sys.stderr)
        return 2
    print(f"{name} set for the cluster; every worker takes it up within {_poll_s():g} s")
    return 0


def _poll_s() -> float:
    from cluster.live_settings import POLL_S

    return POLL_S


def _lines(path: Path, key: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTask(key, f"cannot read {path}: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
