#!/usr/bin/env python3
"""OCI image archives (the tar form of an OCI image layout) without a container engine.

  ociarchive.py from-rootfs ROOTFS.tar OUT.tar NAME [--arch ARCH]
      wraps a root filesystem tarball (mmdebstrap's output) into a one-layer image named NAME: the base that
      buildah builds the Dockerfiles on. Device nodes are dropped (the runtime mounts its own /dev).
  ociarchive.py add-name ARCHIVE.tar NAME
      gives the image in ARCHIVE a second full reference (a second index entry for the same manifest), so that
      `ctr -n k8s.io images import` creates both names.
  ociarchive.py inspect ARCHIVE.tar
      prints {"names": [...], "config": <image config>, "layers": [{"digest", "size"}]} as JSON.
  ociarchive.py unpack ARCHIVE.tar DIR
      applies the layers in order into DIR (whiteouts honoured), as a runtime's snapshotter would.

Names are full references (registry/repository:tag). containerd names an imported image from the
`io.containerd.image.name` annotation, and from `org.opencontainers.image.ref.name` when that is a full reference
(buildah writes the latter), so both annotations carry the full reference here.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode = len(data), 0o644
    out.addfile(ti, io.BytesIO(data))


def _dumps(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def from_rootfs(rootfs: str, out: str, name: str, arch: str) -> str:
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        # The layer: the rootfs without device nodes, then gzip (mtime 0: the same rootfs gives the same digest).
        raw = os.path.join(tmp, "layer.tar")
        with tarfile.open(rootfs) as src, tarfile.open(raw, "w", format=tarfile.PAX_FORMAT) as dst:
            for m in src:
                if m.ischr() or m.isblk():
                    continue
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        diff_id = _sha256_file(raw)
        gz = os.path.join(tmp, "layer.tar.gz")
        with open(raw, "rb") as f, gzip.GzipFile(gz, "wb", compresslevel=6, mtime=0) as g:
            shutil.copyfileobj(f, g, 1 << 20)
        os.unlink(raw)
        layer_digest, layer_size = _sha256_file(gz), os.path.getsize(gz)
        config = _dumps({
            "architecture": arch, "os": "linux",
            "config": {"Env": [PATH], "Cmd": ["python3"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
            "history": [{"created_by": "scripts/ociarchive.py from-rootfs (mmdebstrap bookworm minbase)"}],
        })
        config_digest = hashlib.sha256(config).hexdigest()
        manifest = _dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": "sha256:" + config_digest, "size": len(config)},
            "layers": [{"mediaType": LAYER_GZ, "digest": "sha256:" + layer_digest, "size": layer_size}],
        })
        manifest_digest = hashlib.sha256(manifest).hexdigest()
        index = {"schemaVersion": 2, "manifests": [_entry(manifest_digest, len(manifest), arch, name)]}
        tmp_out = out + ".part"
        with tarfile.open(tmp_out, "w") as t:
            _add_bytes(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            _add_bytes(t, "index.json", _dumps(index))
            _add_bytes(t, "blobs/sha256/" + config_digest, config)
            _add_bytes(t, "blobs/sha256/" + manifest_digest, manifest)
            t.add(gz, "blobs/sha256/" + layer_digest)
        os.replace(tmp_out, out)
    return "sha256:" + manifest_digest


def _entry(digest: str, size: int, arch: str, name: str) -> dict:
    return {"mediaType": MANIFEST, "digest": "sha256:" + digest, "size": size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}}


def _read(t: tarfile.TarFile, name: str) -> bytes:
    f = t.extractfile(name)
    if f is None:
        raise SystemExit(f"{t.name}: no {name} in the archive")
    return f.read()


def _blob(t: tarfile.TarFile, digest: str) -> bytes:
    return _read(t, "blobs/" + digest.replace(":", "/", 1))


def add_name(archive: str, name: str) -> None:
    """Rewrites index.json (first member order kept) with one more entry for the first manifest."""
    with tarfile.open(archive) as t:
        index = json.loads(_read(t, "index.json"))
    first = index["manifests"][0]
    for m in index["manifests"]:  # buildah writes the ref name only; containerd reads either annotation
        ann = m.setdefault("annotations", {})
        ref = ann.get("org.opencontainers.image.ref.name")
        if ref:
            ann.setdefault("io.containerd.image.name", ref)
    if not any(m["annotations"].get("io.containerd.image.name") == name for m in index["manifests"]):
        extra = dict(first)
        extra["annotations"] = {**first.get("annotations", {}), "io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name}
        index["manifests"].append(extra)
    tmp_out = archive + ".part"
    with tarfile.open(archive) as src, tarfile.open(tmp_out, "w") as dst:
        for m in src:
            if os.path.normpath(m.name) == "index.json":
                _add_bytes(dst, "index.json", _dumps(index))
            else:
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    os.replace(tmp_out, archive)


def inspect(archive: str) -> dict:
    with tarfile.open(archive) as t:
        index = json.loads(_read(t, "index.json"))
        names = [m.get("annotations", {}).get("io.containerd.image.name")
                 or m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
        manifest = json.loads(_blob(t, index["manifests"][0]["digest"]))
        config = json.loads(_blob(t, manifest["config"]["digest"]))
    return {"names": names, "config": config,
            "layers": [{"digest": l["digest"], "size": l["size"], "mediaType": l["mediaType"]}
                       for l in manifest["layers"]]}


def _remove(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        if os.path.lexists(path):
            os.unlink(path)
    else:
        shutil.rmtree(path)


def unpack(archive: str, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    with tarfile.open(archive) as t:
        index = json.loads(_read(t, "index.json"))
        manifest = json.loads(_blob(t, index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            member = t.getmember("blobs/" + layer["digest"].replace(":", "/", 1))
            fobj = t.extractfile(member)
            mode = "r|gz" if layer["mediaType"].endswith("gzip") else "r|"
            with tarfile.open(fileobj=fobj, mode=mode) as lt:
                for m in lt:
                    name = os.path.normpath(m.name.lstrip("/"))
                    name = "" if name == "." else name
                    if name.startswith(".."):
                        raise SystemExit(f"{archive}: layer member {m.name!r} escapes the root")
                    base, leaf = os.path.split(name)
                    if leaf == ".wh..wh..opq":  # opaque directory: drop what lower layers put there
                        d = os.path.join(root, base)
                        for e in os.listdir(d) if os.path.isdir(d) else []:
                            _remove(os.path.join(d, e))
                        continue
                    if leaf.startswith(".wh."):
                        _remove(os.path.join(root, base, leaf[4:]))
                        continue
                    if m.ischr() or m.isblk() or m.isfifo() or not name:
                        continue
                    target = os.path.join(root, name)
                    if os.path.lexists(target) and not (m.isdir() and os.path.isdir(target)
                                                        and not os.path.islink(target)):
                        _remove(target)
                    # "fully_trusted": the layers are our own build; keep owners, modes, links as they are.
                    lt.extract(m, root, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ociarchive.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("from-rootfs")
    for arg in ("rootfs", "out", "name"):
        p.add_argument(arg)
    p.add_argument("--arch", default={"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine,
                                                                                   os.uname().machine))
    p = sub.add_parser("add-name")
    p.add_argument("archive")
    p.add_argument("name")
    p = sub.add_parser("inspect")
    p.add_argument("archive")
    p = sub.add_parser("unpack")
    p.add_argument("archive")
    p.add_argument("dir")
    a = ap.parse_args(argv)
    if a.cmd == "from-rootfs":
        print(f"{a.out}: {a.name} manifest {from_rootfs(a.rootfs, a.out, a.name, a.arch)}")
    elif a.cmd == "add-name":
        add_name(a.archive, a.name)
    elif a.cmd == "inspect":
        json.dump(inspect(a.archive), sys.stdout, indent=1)
        print()
    else:
        unpack(a.archive, a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
