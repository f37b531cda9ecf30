"""``kubectl dra``: ``dra-exporter explain`` where operators already are.

kubectl runs any ``kubectl-dra`` on ``PATH`` for ``kubectl dra …`` (its plugin convention), so the
package installs that console script. It takes kubectl's own flags and habits and hands the rest to
``dra-exporter explain`` (one implementation, one set of messages and exit codes):

- ``kubectl dra explain CLAIM`` explains a claim of the namespace: ``-n/--namespace``, else the
  kubeconfig context's namespace, else ``default`` (as kubectl); ``NAMESPACE/CLAIM`` names it whole.
- ``kubectl dra explain --all`` explains every unallocated claim of that namespace, ``-A`` (or
  ``--all-namespaces``) of every namespace.
- ``--kubeconfig`` and ``--context`` choose the cluster as for kubectl (``$KUBECONFIG`` or
  ``~/.kube/config``, its current context), ``-o json`` prints JSON (``-o text``, the default, prose).

Bad flags exit 2 with one line, as every dra-exporter command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

PROG = "kubectl dra"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # one line and exit 2, no usage dump
        print(f"{self.prog}: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="dra-exporter's answers, as a kubectl plugin.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    explain = commands.add_parser(
        "explain", help="why is a ResourceClaim pending (dra-exporter explain)",
        description="Whether the scheduler could allocate a ResourceClaim now and, per request, what keeps "
                    "the devices it needs: dra-exporter explain, with kubectl's flags.")
    explain.add_argument("claim", nargs="?", metavar="[NAMESPACE/]CLAIM",
                         help="the claim; without NAMESPACE/ it is in -n's namespace (else the context's)")
    explain.add_argument("--all", action="store_true", help="every unallocated claim of the namespace")
    explain.add_argument("-A", "--all-namespaces", action="store_true", help="with --all implied: every namespace")
    explain.add_argument("-n", "--namespace", help="the namespace [default: the kubeconfig context's, else default]")
    explain.add_argument("--kubeconfig", help="the kubeconfig [default: $KUBECONFIG, else ~/.kube/config]")
    explain.add_argument("--context", help="the kubeconfig context [default: its current context]")
    explain.add_argument("-o", "--output", choices=("text", "json"), default="text",
                         help="text (default) or json")
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """kubectl's arguments after ``dra``; exits 2 with one line for what kubectl would refuse."""
    return _parser().parse_args(list(argv))


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of ``context`` (default: the current one) in ``kubeconfig`` (default: kubectl's),
    ``default`` where it names none or there is no kubeconfig to read, as kubectl does."""
    from kubernetes.config.config_exception import ConfigException

    from .sources.kubeapi_http import list_kube_config_contexts

    path = kubeconfig or os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])
    if not os.path.exists(path):
        return "default"
    try:
        contexts, current = list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, ValueError, TypeError, KeyError):
        return "default"  # dra-exporter explain says what is wrong with the kubeconfig, in one line
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


def explain_args(args: argparse.Namespace) -> list[str]:
    """The ``dra-exporter explain`` command line for kubectl's ``args``."""
    out = ["explain", "--format", args.output]
    for flag, value in (("--kubeconfig", args.kubeconfig), ("--context", args.context)):
        if value:
            out += [flag, value]
    if args.claim and (args.all or args.all_namespaces):
        raise _UsageError("name one claim or give --all (or -A), not both")
    if args.claim:
        if "/" in args.claim:
            namespace, _, _ = args.claim.partition("/")
            if args.namespace and args.namespace != namespace:
                raise _UsageError(f"{args.claim!r} is not in namespace {args.namespace!r} (-n)")
            return [*out, args.claim]
        namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
        return [*out, f"{namespace}/{args.claim}"]
    if args.all_namespaces:
        if args.namespace:
            raise _UsageError("-A is every namespace: leave -n out")
        return [*out, "--all"]
    if args.all:
        return [*out, "--all", "--namespace", args.namespace or context_namespace(args.kubeconfig, args.context)]
    raise _UsageError("name a claim as CLAIM or NAMESPACE/CLAIM, or give --all (this namespace) or -A (every one)")


class _UsageError(ValueError):
    pass


def main(argv: Sequence[str] | None = None) -> None:
    """The ``kubectl-dra`` console script."""
    from . import cli

    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        command = explain_args(args)
    except _UsageError as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    cli.main(command, prog_name=f"{PROG}")


if __name__ == "__main__":
    main()
