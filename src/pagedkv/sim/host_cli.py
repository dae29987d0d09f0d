"""``pagedkv simulate`` flags of the host-memory tier (:mod:`pagedkv.sim.host_tier`).

``--host-memory SIZE[,SIZE...]`` turns the tier on (the first size is the run the report
describes; a table compares it with a device-only replay and further sizes);
``--host-bandwidth-gbps`` sets the link (GB/s per direction). A size that does not parse
is a usage error (exit 2); a host tier in pure-cache mode, with ``--replicas`` or with
``--find-capacity`` is a bad request (exit 1).
"""

from __future__ import annotations

import argparse

from pagedkv.cli_args import number_arg
from pagedkv.errors import InvalidArgumentError, PagedKVError
from pagedkv.sim.host_tier import (
    DEFAULT_BANDWIDTH_GBPS,
    WRITE_POLICIES,
    HostMemoryConfig,
    parse_host_sizes,
)

__all__ = ["add_host_arguments", "host_config_from_args"]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return parse_host_sizes(text)
    except PagedKVError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: GB/s per direction, above 0 and at most 10^6 (a petabyte per second).
_bandwidth = number_arg("--host-bandwidth-gbps", minimum=0, minimum_exclusive=True,
                        maximum=1e6)


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the host-tier flag group to the ``simulate`` parser."""
    h = parser.add_argument_group("host-memory tier (engine mode)")
    h.add_argument("--host-memory", type=_sizes, default=None, metavar="SIZE[,SIZE...]",
                   help="keep blocks evicted from the GPU in this much CPU memory and load "
                   "hits from it (e.g. 256GiB; bytes per block from --model's page size, "
                   "else 128 KiB per token); a table compares it with a device-only replay "
                   "and any further sizes (default: off)")
    h.add_argument("--host-bandwidth-gbps", type=_bandwidth, default=None, metavar="GBPS",
                   help=f"host <-> GPU copy rate in GB/s per direction (default "
                   f"{DEFAULT_BANDWIDTH_GBPS:g})")
    h.add_argument("--no-host-baseline", action="store_true",
                   help="skip the device-only replay the host table compares with")
    h.add_argument("--host-write-policy", choices=WRITE_POLICIES, default=None,
                   help="on-eviction: copy a block out when the GPU evicts it (the step "
                   "reusing it waits; default); write-through: copy every block as it is "
                   "cached (overlaps the next step)")


def host_config_from_args(args: argparse.Namespace) -> HostMemoryConfig | None:
    """The host tier the flags ask for, or None.

    Raises:
        InvalidArgumentError: a host flag without ``--host-memory``, or a host tier with
            ``--replicas`` or ``--find-capacity``.
    """
    sizes = args.host_memory
    if sizes is None:
        for flag in ("host_bandwidth_gbps", "host_write_policy", "no_host_baseline"):
            if getattr(args, flag) not in (None, False):
                raise InvalidArgumentError(
                    f"--{flag.replace('_', '-')} needs --host-memory")
        return None
    if getattr(args, "replicas", None) is not None:
        raise InvalidArgumentError("--host-memory is simulated for one replica; drop "
                                   "--replicas")
    if getattr(args, "find_capacity", False):
        raise InvalidArgumentError("--find-capacity searches device memory without a host "
                                   "tier; drop --host-memory")
    bandwidth = args.host_bandwidth_gbps or DEFAULT_BANDWIDTH_GBPS
    return HostMemoryConfig(memory_bytes=sizes[0], bandwidth_gbps=bandwidth,
                            write_policy=args.host_write_policy or "on-eviction",
                            sweep_memory_bytes=sizes[1:],
                            device_only_baseline=not args.no_host_baseline)
