"""moto_server with S3's conditional writes made atomic, as S3 makes them.

moto checks `If-None-Match: *` / `If-Match` and then stores the object as two steps on a
threaded server, so two PUTs racing for one key can both pass the check: S3 never lets that
happen, and the lease protocol relies on it. Every PutObject here runs under one lock; the other
requests stay concurrent. Run as `python tests/s3_atomic_server.py -H HOST -p PORT` (moto_server's
own arguments).
"""

from __future__ import annotations

import sys
import threading

from moto import server
from moto.s3.responses import S3Response

_LOCK = threading.Lock()
_put_object = S3Response.put_object


def _atomic_put_object(self, *args, **kwargs):
    with _LOCK:
        return _put_object(self, *args, **kwargs)


S3Response.put_object = _atomic_put_object

if __name__ == "__main__":
    sys.exit(server.main())
