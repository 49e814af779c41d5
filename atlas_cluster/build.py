"""Build the control plane from the upstream Go modules, once per machine, into
``$ATLAS_CACHE_DIR/kube/<versions>/bin`` (atlas_cluster/versions.py pins them).

python -m atlas_cluster.build            # build what is missing (progress on stderr)
python -m atlas_cluster.build --print    # print the bin folder (builds first if needed)
python -m atlas_cluster.build --controllers jobset,kueue,trainer,training-operator
                                         # and these backends' controllers, each into
                                         # $ATLAS_CACHE_DIR/kube/controllers/<name>-<version>/bin
python -m atlas_cluster.build --s3       # only the S3-compatible server (Versity's S3 Gateway, for
                                         # atlas cluster up --s3) into $ATLAS_CACHE_DIR/s3/versitygw-<version>/bin
python -m atlas_cluster.build --kube-score
                                         # only kube-score (tests/training/test_kube_score.py's judge) into
                                         # $ATLAS_CACHE_DIR/kube-score/kube-score-<version>/bin

The control plane does not install with a plain ``go install``, so each binary is built in a wrapper module:
- etcd: its server module replaces its sibling modules by relative paths, which ``go install`` refuses; required
  from a wrapper module, the siblings resolve to their published versions.
- kube-apiserver, kube-controller-manager, kube-scheduler: ``k8s.io/kubernetes`` replaces every staging module
  (``k8s.io/api``…) with ``./staging/...``; the wrapper replaces each with its published ``v0.<minor>.<patch>``,
  the list read from the release's own go.mod on the module proxy, and the version is stamped in so clients see a
  real one.
- the backends' controllers (JobSet, Kueue, Trainer, training-operator): each is required from a wrapper module of
  its own as well (a ``tools.go`` importing its main package keeps ``go mod tidy`` from dropping it) and built from
  there, rather than ``go install MODULE/cmd/...@VERSION``: one way for every binary, the same ``_link`` into a
  folder of ours (``go install`` writes to GOBIN), and the dependency versions its go.mod asks for, as a user's
  ``go get`` resolves them.
- the S3 server (``versitygw``, atlas_cluster/s3.py runs it) the same way as a controller: its go.mod has no
  replace, but one way for every binary; kube-score (tests/training/test_kube_score.py) likewise.

Each binary is linked to a temporary name and renamed into place: a build interrupted or run twice at once never
leaves a half-written binary. The Go module and build caches (``go env GOMODCACHE``, ``GOCACHE``) make a rebuild
after a version change mostly a link.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from atlas_cluster import versions
from atlas_cluster.paths import kube_root
from atlas_contract.cache import cache_root

ETCD_BINARIES = ("etcd",)
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = ETCD_BINARIES + KUBE_BINARIES
# kubebuilder's setup-envtest lays out etcd and kube-apiserver (and kubectl) in one folder; a --bin-dir of its
# needs kube-controller-manager beside them only for garbage collection and namespaces, kube-scheduler only where
# pods are to be bound to a node.
REQUIRED = ("etcd", "kube-apiserver")


class BuildError(RuntimeError):
    """A build step failed, or Go is missing/too old: the message says what to install or read."""


def default_bin_dir() -> Path:
    return kube_root() / versions.control_plane_key() / "bin"


def missing(bin_dir: Path, names: tuple[str, ...] = BINARIES) -> list[str]:
    return [name for name in names if not os.access(bin_dir / name, os.X_OK)]


def go_binary() -> str:
    """``go`` from PATH at the version k8s.io/kubernetes asks for, else BuildError saying what to install."""
    go = shutil.which("go")
    wanted = ".".join(map(str, versions.GO_MINIMUM))
    if not go:
        raise BuildError(f"no `go` on PATH: install Go {wanted} or later (https://go.dev/dl), or pass --bin-dir")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", out)
    if not found or tuple(map(int, found.groups())) < versions.GO_MINIMUM:
        found_version = out or "of an unknown version"
        raise BuildError(f"`go` is {found_version}; Kubernetes {versions.KUBERNETES} needs Go {wanted}")
    return go


def module_dir(module: str, version: str) -> Path:
    """``module@version``'s tree in the Go module cache (``go mod download``: fetched once, read-only): where the
    backends' CRDs, RBAC and webhook configurations are read from."""
    done = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    info = json.loads(done.stdout or "{}")
    if done.returncode != 0 or "Dir" not in info:
        raise BuildError(f"go mod download {module}@{version}: {info.get('Error') or done.stderr.strip()}")
    return Path(info["Dir"])


def _run(go: str, args: list[str], cwd: Path, what: str) -> str:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    done = subprocess.run([go, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise BuildError(f"{what}: `go {' '.join(args)}` failed in {cwd}:\n{tail}")
    return done.stdout


def _wrapper(path: Path, module: str, go_mod_extra: str = "") -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "go.mod").write_text(f"module {module}\n\ngo {'.'.join(map(str, versions.GO_MINIMUM))}.0\n{go_mod_extra}")
    (path / "go.sum").unlink(missing_ok=True)


def _link(go: str, wrapper: Path, packages: dict[str, str], bin_dir: Path, ldflags: str) -> None:
    """``go build`` each package (binary name → package) to a temporary file, then rename it into ``bin_dir``."""
    tmp = bin_dir / f".build-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        for name, package in packages.items():
            _run(go, ["build", "-ldflags", ldflags, "-o", str(tmp / name), package], wrapper, name)
        for name in packages:
            os.replace(tmp / name, bin_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_etcd(go: str, src: Path, bin_dir: Path) -> None:
    wrapper = src / f"etcd-{versions.ETCD}"
    _wrapper(wrapper, "atlas.local/etcd-build")
    _run(go, ["get", f"go.etcd.io/etcd/server/v3@{versions.ETCD}"], wrapper, "etcd")
    _link(go, wrapper, {"etcd": "go.etcd.io/etcd/server/v3"}, bin_dir, "-s -w")


def staging_modules(go: str, cwd: Path) -> list[str]:
    """The modules ``k8s.io/kubernetes`` replaces with ``./staging/...``, from its go.mod on the module proxy."""
    info = json.loads(_run(go, ["mod", "download", "-json", f"k8s.io/kubernetes@{versions.KUBERNETES}"], cwd, "kube"))
    go_mod = Path(info["GoMod"]).read_text()
    modules = re.findall(r"^\s*(\S+)\s*=>\s*\./staging/", go_mod, flags=re.M)
    if not modules:
        release = f"k8s.io/kubernetes@{versions.KUBERNETES}"
        raise BuildError(f"{release}'s go.mod replaces no staging module: {info['GoMod']}")
    return modules


def build_kube(go: str, src: Path, bin_dir: Path) -> None:
    wrapper = src / f"kubernetes-{versions.KUBERNETES}"
    wrapper.mkdir(parents=True, exist_ok=True)
    staging_version = "v0." + versions.KUBERNETES.removeprefix("v1.")
    replaces = "".join(f"\t{m} => {m} {staging_version}\n" for m in staging_modules(go, wrapper))
    _wrapper(
        wrapper,
        "atlas.local/kube-build",
        f"\nrequire k8s.io/kubernetes {versions.KUBERNETES}\n\nreplace (\n{replaces})\n",
    )
    # Only what is missing: a folder built before kube-scheduler was added gets it without relinking the rest.
    names = missing(bin_dir, KUBE_BINARIES) or list(KUBE_BINARIES)
    packages = {name: f"k8s.io/kubernetes/cmd/{name}" for name in names}
    _run(go, ["get", *(f"{p}@{versions.KUBERNETES}" for p in packages.values())], wrapper, "kube")
    major, minor = versions.KUBERNETES.removeprefix("v").split(".")[:2]
    stamp = "k8s.io/component-base/version"
    ldflags = (
        f"-s -w -X {stamp}.gitVersion={versions.KUBERNETES} -X {stamp}.gitMajor={major} "
        f"-X {stamp}.gitMinor={minor} -X {stamp}.gitTreeState=clean"
    )
    _link(go, wrapper, packages, bin_dir, ldflags)


def controller_bin_dir(name: str) -> Path:
    return kube_root() / "controllers" / versions.controller_key(versions.CONTROLLERS[name]) / "bin"


def controller_binary(name: str, bin_dir: Path | None = None) -> Path:
    """Where the controller ``name``'s binary is (``bin_dir`` instead of its cache folder when given)."""
    return (bin_dir or controller_bin_dir(name)) / versions.CONTROLLERS[name].binary


def parse_controllers(text: str | None) -> tuple[str, ...]:
    """``jobset,kueue`` → ("jobset", "kueue"); ValueError naming the known ones on an unknown name."""
    names = tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    unknown = [n for n in names if n not in versions.CONTROLLERS]
    if unknown:
        raise ValueError(f"unknown controller {', '.join(unknown)}: choose from {', '.join(versions.CONTROLLERS)}")
    return names


def build_controller(go: str, name: str, bin_dir: Path) -> None:
    spec = versions.CONTROLLERS[name]
    wrapper = bin_dir.parent / "src"
    _wrapper(wrapper, f"atlas.local/{name}-build", f"\nrequire {spec.module} {spec.version}\n")
    (wrapper / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{spec.package}"\n')
    _run(go, ["mod", "tidy"], wrapper, name)
    _link(go, wrapper, {spec.binary: spec.package}, bin_dir, "-s -w")


def ensure_controllers(names: tuple[str, ...], bin_dir: Path | None = None, log=None) -> dict[str, Path]:
    """Each named controller's binary, building what is missing (minutes each, once per machine)."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    found = {}
    for name in names:
        binary = controller_binary(name, bin_dir)
        if not os.access(binary, os.X_OK):
            spec = versions.CONTROLLERS[name]
            cold = "~4-10 min cold" if name == "kueue" else "~1.5-3 min cold"  # 2 cores, idle to busy
            say(f"atlas cluster: building {name} {spec.version} from the Go module proxy ({cold}) into {binary.parent}")
            started = time.monotonic()
            binary.parent.mkdir(parents=True, exist_ok=True)
            build_controller(go_binary(), name, binary.parent)
            say(f"atlas cluster: built {name} in {time.monotonic() - started:.0f} s")
        found[name] = binary
    return found


def s3_server_binary() -> Path:
    """Where the S3 server's binary is (built or not): ``$ATLAS_CACHE_DIR/s3/versitygw-<version>/bin/versitygw``."""
    return cache_root() / "s3" / versions.s3_server_key() / "bin" / "versitygw"


def build_s3_server(go: str, binary: Path) -> None:
    wrapper = binary.parent.parent / "src"
    _wrapper(wrapper, "atlas.local/versitygw-build", f"\nrequire {versions.VERSITYGW_MODULE} {versions.VERSITYGW}\n")
    (wrapper / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{versions.VERSITYGW_PACKAGE}"\n')
    _run(go, ["mod", "tidy"], wrapper, "versitygw")
    stamp = f"-X main.Version={versions.VERSITYGW} -X main.Build={versions.VERSITYGW_MODULE}"  # as its Makefile
    _link(go, wrapper, {binary.name: versions.VERSITYGW_PACKAGE}, binary.parent, f"-s -w {stamp}")


def ensure_s3_server(binary: Path | None = None, log=None) -> Path:
    """The S3 server's binary (at ``binary`` instead of its cache folder when given), built from its Go module when
    missing (about 2 minutes cold on 2 cores, once per machine)."""
    binary = binary or s3_server_binary()
    if not os.access(binary, os.X_OK):
        say = log or (lambda line: print(line, file=sys.stderr, flush=True))
        go = go_binary()
        say(f"atlas cluster: building versitygw {versions.VERSITYGW} from the Go module proxy into {binary.parent}")
        started = time.monotonic()
        binary.parent.mkdir(parents=True, exist_ok=True)
        build_s3_server(go, binary)
        say(f"atlas cluster: built versitygw in {time.monotonic() - started:.0f} s")
    return binary


def kube_score_binary() -> Path:
    """Where kube-score's binary is (built or not):
    ``$ATLAS_CACHE_DIR/kube-score/kube-score-<version>/bin/kube-score``."""
    return cache_root() / "kube-score" / versions.kube_score_key() / "bin" / "kube-score"


def build_kube_score(go: str, binary: Path) -> None:
    wrapper = binary.parent.parent / "src"
    _wrapper(wrapper, "atlas.local/kube-score-build", f"\nrequire {versions.KUBE_SCORE_MODULE} {versions.KUBE_SCORE}\n")
    tools = f'//go:build tools\n\npackage tools\n\nimport _ "{versions.KUBE_SCORE_PACKAGE}"\n'
    (wrapper / "tools.go").write_text(tools)
    _run(go, ["mod", "tidy"], wrapper, "kube-score")
    stamp = f"-X main.version={versions.KUBE_SCORE.removeprefix('v')}"  # as its goreleaser config
    _link(go, wrapper, {binary.name: versions.KUBE_SCORE_PACKAGE}, binary.parent, f"-s -w {stamp}")


def ensure_kube_score(binary: Path | None = None, log=None) -> Path:
    """kube-score's binary (at ``binary`` instead of its cache folder when given), built from its Go module when
    missing (under a minute cold on 2 cores, once per machine)."""
    binary = binary or kube_score_binary()
    if not os.access(binary, os.X_OK):
        say = log or (lambda line: print(line, file=sys.stderr, flush=True))
        go = go_binary()
        say(f"atlas cluster: building kube-score {versions.KUBE_SCORE} from the Go module proxy into {binary.parent}")
        started = time.monotonic()
        binary.parent.mkdir(parents=True, exist_ok=True)
        build_kube_score(go, binary)
        say(f"atlas cluster: built kube-score in {time.monotonic() - started:.0f} s")
    return binary


def ensure_built(bin_dir: Path | None = None, log=None) -> Path:
    """The bin folder with every control-plane binary, building what is missing (minutes, once per machine)."""
    bin_dir = bin_dir or default_bin_dir()
    todo = missing(bin_dir)
    if not todo:
        return bin_dir
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    go = go_binary()
    bin_dir.mkdir(parents=True, exist_ok=True)
    src = bin_dir.parent / "src"
    steps = [
        ("etcd", versions.ETCD, ETCD_BINARIES, build_etcd, "~1 min cold"),
        (
            "kube-apiserver, kube-controller-manager, kube-scheduler",
            versions.KUBERNETES,
            KUBE_BINARIES,
            build_kube,
            "~5 min cold",
        ),
    ]
    for what, version, names, build, cold in steps:
        if not set(names) & set(todo):
            continue
        if not set(names) <= set(todo):  # a folder built before a binary was added: only the new one
            what, cold = ", ".join(n for n in names if n in todo), "under a minute with Go's build cache warm"
        say(f"atlas cluster: building {what} {version} from the Go module proxy ({cold}) into {bin_dir}")
        started = time.monotonic()
        build(go, src, bin_dir)
        say(f"atlas cluster: built {what} in {time.monotonic() - started:.0f} s")
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas_cluster.build", description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, help="build into this folder (default: the cache's)")
    parser.add_argument(
        "--print", action="store_true", help="print the bin folder (with --s3 or --kube-score: the binary) when done"
    )
    parser.add_argument(
        "--controllers",
        default="",
        metavar="NAMES",
        help=f"also build these backends' controllers, comma-separated ({','.join(versions.CONTROLLERS)}; "
        "default none)",
    )
    parser.add_argument(
        "--s3",
        action="store_true",
        help="build only the S3-compatible server (versitygw; atlas cluster up --s3), not the control plane",
    )
    parser.add_argument(
        "--kube-score",
        action="store_true",
        help="build only kube-score (the tests' judge of the chart and the rendered runs), not the control plane",
    )
    args = parser.parse_args(argv)
    try:
        names = parse_controllers(args.controllers)
    except ValueError as exc:
        parser.error(str(exc))
    if args.s3 and names:
        parser.error("--s3 builds only the S3 server: build the controllers in a run of their own")
    if args.kube_score and (names or args.s3):
        parser.error("--kube-score builds only kube-score: build the others in a run of their own")
    binary = None
    try:
        if args.s3:
            binary = ensure_s3_server()
        elif args.kube_score:
            binary = ensure_kube_score()
        else:
            bin_dir = ensure_built(args.bin_dir)
            ensure_controllers(names)
    except BuildError as exc:
        print(f"atlas cluster: {exc}", file=sys.stderr)
        return 1
    if args.print:
        print(binary or bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
