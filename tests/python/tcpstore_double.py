"""A stand-in for PyTorch's TCPStore server (the queries dmx uses: VALIDATE, SET, GET, ADD, CHECK,
DELETE_KEY), written from the protocol as docs/cluster.md states it, for machines without torch.
It checks dmx's client against our reading of the protocol only; test_tcpstore_torch.py checks it
against torch's own server."""
import socket
import struct
import threading

MAGIC = 0x3C85F7CE


class TCPStoreDouble:
    def __init__(self):
        self.data = {}
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.threads = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.stopped = True
        self.sock.close()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _exact(c, n):
        b = b""
        while len(b) < n:
            got = c.recv(n - len(b))
            if not got:
                raise EOFError
            b += got
        return b

    def _bytes(self, c):
        (n,) = struct.unpack("<Q", self._exact(c, 8))
        return self._exact(c, n)

    def _serve(self, c):
        try:
            q = self._exact(c, 1)[0]
            if q != 0 or struct.unpack("<I", self._exact(c, 4))[0] != MAGIC:
                return c.close()
            while True:
                q = self._exact(c, 1)[0]
                with self.lock:
                    if q == 1:  # SET
                        k = self._bytes(c)
                        self.data[k] = self._bytes(c)
                    elif q == 3:  # GET
                        v = self.data[self._bytes(c)]
                        c.sendall(struct.pack("<Q", len(v)) + v)
                    elif q == 4:  # ADD
                        k = self._bytes(c)
                        (d,) = struct.unpack("<q", self._exact(c, 8))
                        v = int(self.data.get(k, b"0")) + d
                        self.data[k] = str(v).encode()
                        c.sendall(struct.pack("<q", v))
                    elif q == 5:  # CHECK
                        (n,) = struct.unpack("<Q", self._exact(c, 8))
                        keys = [self._bytes(c) for _ in range(n)]
                        c.sendall(bytes([0 if all(k in self.data for k in keys) else 1]))
                    elif q == 8:  # DELETE_KEY
                        c.sendall(struct.pack("<q", 1 if self.data.pop(self._bytes(c), None) is not None else 0))
                    else:
                        return c.close()
        except (EOFError, OSError, KeyError):
            c.close()
