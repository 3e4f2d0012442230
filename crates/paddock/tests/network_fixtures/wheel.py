# Builds a minimal wheel (paddock_demo 1.0) and a PEP 503 simple index for it under OUT.
import base64
import hashlib
import os
import sys
import zipfile

out = sys.argv[1]
files = {
    "paddock_demo/__init__.py": b"VALUE = 42\n",
    "paddock_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: paddock-demo\nVersion: 1.0\n",
    "paddock_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: paddock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{name},sha256={digest},{len(data)}\n"
record += "paddock_demo-1.0.dist-info/RECORD,,\n"
files["paddock_demo-1.0.dist-info/RECORD"] = record.encode()
os.makedirs(os.path.join(out, "packages"), exist_ok=True)
os.makedirs(os.path.join(out, "simple", "paddock-demo"), exist_ok=True)
wheel = "paddock_demo-1.0-py3-none-any.whl"
with zipfile.ZipFile(os.path.join(out, "packages", wheel), "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
with open(os.path.join(out, "simple", "paddock-demo", "index.html"), "w") as f:
    f.write(f'<html><body><a href="../../packages/{wheel}">{wheel}</a></body></html>\n')
with open(os.path.join(out, "hello.txt"), "w") as f:
    f.write("hello from outside\n")
