#!/usr/bin/env python3
"""A small stand-in for the Hugging Face hub, for `lumen get`'s tests.

It serves one repository, made from the files of a local folder, with the protocol the hub
speaks to huggingface_hub:

  GET  /api/models/ORG/REPO/revision/REV   {"id", "sha", "siblings": [{"rfilename"}]}
  HEAD /ORG/REPO/resolve/REV/PATH          X-Repo-Commit; ETag (git blob sha1) for plain files;
                                           for LFS files a 302 to /lfs-cdn/ with X-Linked-Etag
                                           (the sha256) and X-Linked-Size
  GET  /ORG/REPO/resolve/REV/PATH          the content, or that 302
  GET  /lfs-cdn/SHA256                     an LFS file's content (what the hub's CDN serves)

Every GET honors "Range: bytes=N-". Unknown repositories answer 401 (as the hub does for a
caller it will not show a repository), unknown revisions 404 with X-Error-Code.

Faults for the tests: --token (401 without "Authorization: Bearer TOKEN"), --cut-after N (the
first CDN GET closes the connection after N bytes), --stall-after N (the first CDN GET stops
sending after N bytes and holds the connection), --corrupt (LFS content with one byte changed),
--rate BYTES_PER_S (CDN throttle, so two downloads overlap), --bad-json (the revision API answers
garbage), --extra-sibling NAME (the file list names one more file, such as "../../x"). Each request is logged, one line:
METHOD PATH range=... auth=yes|no.
"""
import argparse
import fnmatch
import hashlib
import http.server
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

LFS_GLOBS = ["*.safetensors", "tokenizer.json"]


class Repo:
    def __init__(self, repo_id, folder):
        self.id = repo_id
        self.files = {}  # path -> bytes
        for root, _, names in os.walk(folder):
            for n in sorted(names):
                full = os.path.join(root, n)
                rel = os.path.relpath(full, folder).replace(os.sep, "/")
                with open(full, "rb") as f:
                    self.files[rel] = f.read()
        h = hashlib.sha1()
        for p in sorted(self.files):
            h.update(p.encode() + b"\0" + hashlib.sha256(self.files[p]).digest())
        self.commit = h.hexdigest()
        self.sha256 = {p: hashlib.sha256(d).hexdigest() for p, d in self.files.items()}
        self.by_sha = {s: p for p, s in self.sha256.items()}

    def lfs(self, path):
        return any(fnmatch.fnmatch(path, g) for g in LFS_GLOBS)

    def git_oid(self, path):
        data = self.files[path]
        if self.lfs(path):  # the git blob of an LFS file is its pointer
            data = ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" %
                    (self.sha256[path], len(data))).encode()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class State:
    def __init__(self, args, repo):
        self.args = args
        self.repo = repo
        self.lock = threading.Lock()
        self.cdn_gets = 0
        self.log = open(args.log, "a", buffering=1) if args.log else None

    def first_cdn_get(self):
        with self.lock:
            self.cdn_gets += 1
            return self.cdn_gets == 1

    def write_log(self, line):
        if self.log:
            with self.lock:
                self.log.write(line + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-hub"

    def log_message(self, fmt, *a):
        pass

    @property
    def st(self):
        return self.server.state

    def send(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def error(self, code, error_code, message, head=False):
        self.send(code, json.dumps({"error": message}).encode(),
                  {"Content-Type": "application/json", "X-Error-Code": error_code,
                   "X-Error-Message": message}, head)

    def authorized(self):
        tok = self.st.args.token
        return not tok or self.headers.get("Authorization") == "Bearer " + tok

    def do_HEAD(self):
        self.route(head=True)

    def do_GET(self):
        self.route(head=False)

    def route(self, head):
        path = urllib.parse.urlsplit(self.path).path
        self.st.write_log("%s %s range=%s auth=%s" % (
            self.command, path, self.headers.get("Range", "-"),
            "yes" if self.headers.get("Authorization") else "no"))
        parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
        repo = self.st.repo
        if parts[:1] == ["lfs-cdn"] and len(parts) == 2:
            return self.cdn(parts[1], head)
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            rid, rev = "/".join(parts[2:4]), "/".join(parts[5:])
            if not self.authorized() or rid != repo.id:
                return self.error(401, "RepoNotFound", "Repository not found", head)
            if rev not in ("main", repo.commit):
                return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
            extra = [self.st.args.extra_sibling] if self.st.args.extra_sibling else []
            body = json.dumps({"id": repo.id, "sha": repo.commit,
                               "siblings": [{"rfilename": p} for p in sorted(repo.files) + extra]})
            if self.st.args.bad_json:
                body = body[:len(body) // 2]
            return self.send(200, body.encode(), {"Content-Type": "application/json"}, head)
        if len(parts) >= 5 and parts[2] == "resolve":
            rid, rev, fpath = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if not self.authorized() or rid != repo.id:
                return self.error(401, "RepoNotFound", "Repository not found", head)
            if rev not in ("main", repo.commit):
                return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
            if fpath not in repo.files:
                return self.error(404, "EntryNotFound", "Entry not found", head)
            return self.resolve(fpath, head)
        self.error(404, "NotFound", "no such route", head)

    def resolve(self, fpath, head):
        repo = self.st.repo
        common = {"X-Repo-Commit": repo.commit, "ETag": '"%s"' % repo.git_oid(fpath)}
        if repo.lfs(fpath):
            host = self.headers.get("Host", "127.0.0.1")
            common.update({
                "X-Linked-Etag": '"%s"' % repo.sha256[fpath],
                "X-Linked-Size": str(len(repo.files[fpath])),
                "Location": "http://%s/lfs-cdn/%s" % (host, repo.sha256[fpath])})
            return self.send(302, b"", common, head)
        self.content(repo.files[fpath], common, head)

    def cdn(self, sha, head):
        repo = self.st.repo
        if sha not in repo.by_sha:
            return self.error(404, "EntryNotFound", "no such object", head)
        data = repo.files[repo.by_sha[sha]]
        if self.st.args.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.content(data, {"ETag": '"%s"' % sha}, head, cdn=not head)

    def content(self, data, headers, head, cdn=False):
        start, code = 0, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.send(416, b"", {"Content-Range": "bytes */%d" % len(data)}, head)
            code = 206
            headers = dict(headers, **{"Content-Range": "bytes %d-%d/%d" % (
                start, len(data) - 1, len(data))})
        body = data[start:]
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        a = self.st.args
        if cdn and (a.cut_after or a.stall_after) and len(body) > (a.cut_after or a.stall_after) \
                and self.st.first_cdn_get():
            n = a.cut_after or a.stall_after
            self.wfile.write(body[:n])
            self.wfile.flush()
            if a.stall_after:
                time.sleep(3600)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.write_body(body, a.rate if cdn else 0)

    def write_body(self, body, rate):
        chunk = 1 << 16
        for i in range(0, len(body), chunk):
            self.wfile.write(body[i:i + chunk])
            if rate:
                time.sleep(chunk / rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True, help="ORG/REPO=FOLDER")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--token")
    ap.add_argument("--cut-after", type=int, default=0)
    ap.add_argument("--stall-after", type=int, default=0)
    ap.add_argument("--corrupt", action="store_true")
    ap.add_argument("--rate", type=float, default=0)
    ap.add_argument("--bad-json", action="store_true")
    ap.add_argument("--extra-sibling")
    args = ap.parse_args()
    rid, folder = args.repo.split("=", 1)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.state = State(args, Repo(rid, folder))
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, args.port_file)  # the test sees the port only once it is whole
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
