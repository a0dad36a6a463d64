# A read-only OCI distribution (registry v2) endpoint for the CRI-O scenarios: CRI-O has
# no image import, it pulls. Serves ROOT/manifests/REPO/TAG and ROOT/blobs/sha256/HEX on
# 127.0.0.1, on a port the kernel picks, printed on stdout once listening.
import hashlib, http.server, os, sys

ROOT = sys.argv[1]
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body=b"", ctype="application/json", digest=None):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def read(self, *parts):
        path = os.path.realpath(os.path.join(ROOT, *parts))
        if not path.startswith(os.path.realpath(ROOT) + os.sep) or not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    def do_GET(self):
        path = self.path.split("?")[0]
        if path in ("/v2", "/v2/"):
            return self.reply(200, b"{}")
        if "/manifests/" in path:
            repo, ref = path[len("/v2/"):].split("/manifests/", 1)
            body = self.read("manifests", repo, ref)
            if body is not None:
                return self.reply(200, body, MANIFEST, "sha256:" + hashlib.sha256(body).hexdigest())
        elif "/blobs/sha256:" in path:
            hexd = path.rsplit("sha256:", 1)[1]
            body = self.read("blobs", "sha256", hexd)
            if body is not None:
                return self.reply(200, body, "application/octet-stream", "sha256:" + hexd)
        self.reply(404, b'{"errors":[{"code":"NOT_FOUND"}]}')

    do_HEAD = do_GET

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.command, self.path))


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
