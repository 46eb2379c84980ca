"""A tiny MJPEG-over-HTTP test server (``multipart/x-mixed-replace`` JPEG parts at a fixed rate).

Runs with any Python 3 interpreter:

    python tests/servers/mjpeg_server.py PORT [FPS] [WIDTH HEIGHT]

It listens on 127.0.0.1 only, serves the stream on every path, and prints
``READY http://127.0.0.1:PORT/stream`` once it accepts connections. Where OpenCV and NumPy are
importable each part shows a square that moves with the frame number (so consecutive frames
differ); elsewhere every part is the same small embedded JPEG.
"""

from __future__ import annotations

import base64
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOUNDARY = "hermesframe"

# A 16x16 single-colour JPEG, so the server also runs where OpenCV is missing.
FALLBACK_JPEG = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4"
    "UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
    "Y2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAQABADASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcI"
    "CQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRol"
    "JicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ip"
    "qrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEBAQEBAQAAAAAA"
    "AAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLR"
    "ChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaX"
    "mJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEA"
    "PwCSiiivGPWP/9k="
)


def make_encoder(width: int, height: int):
    """Return a function ``frame_number -> JPEG bytes``.

    Args:
        width: frame width in pixels (used only when OpenCV is available).
        height: frame height in pixels (used only when OpenCV is available).

    Returns:
        The encoder; it draws a moving square when OpenCV and NumPy import, else returns the
        embedded fallback JPEG.
    """
    try:
        import cv2
        import numpy as np
    except ImportError:
        return lambda n: FALLBACK_JPEG

    def encode(n: int) -> bytes:
        img = np.full((height, width, 3), 60, np.uint8)
        side = max(4, min(width, height) // 4)
        x = (n * 4) % max(1, width - side)
        img[height // 2 - side // 2 : height // 2 + side // 2, x : x + side] = (0, 200, 255)
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 80])
        return buf.tobytes() if ok else FALLBACK_JPEG

    return encode


def make_handler(fps: float, encode):
    """Build a request handler class that streams parts at ``fps``.

    Args:
        fps: parts per second, paced on an absolute schedule so the rate does not drift.
        encode: ``frame_number -> JPEG bytes``.

    Returns:
        A ``BaseHTTPRequestHandler`` subclass.
    """
    interval_s = 1.0 / fps

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self.send_response(200)
            self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            start = time.monotonic()
            n = 0
            try:
                while True:
                    jpeg = encode(n)
                    head = (
                        f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                        f"Content-Length: {len(jpeg)}\r\n\r\n"
                    ).encode("ascii")
                    self.wfile.write(head + jpeg + b"\r\n")
                    self.wfile.flush()
                    n += 1
                    time.sleep(max(0.0, start + n * interval_s - time.monotonic()))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; that ends this stream only

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass  # keep test output clean

    return Handler


def main(argv: list[str]) -> int:
    """Serve until killed.

    Args:
        argv: ``[PORT]``, ``[PORT, FPS]`` or ``[PORT, FPS, WIDTH, HEIGHT]``.

    Returns:
        2 on bad arguments; otherwise it does not return until the process is killed.
    """
    try:
        port = int(argv[0])
        fps = float(argv[1]) if len(argv) > 1 else 10.0
        width, height = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (160, 120)
    except (IndexError, ValueError):
        print("usage: mjpeg_server.py PORT [FPS] [WIDTH HEIGHT]", file=sys.stderr)
        return 2
    handler = make_handler(fps, make_encoder(width, height))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    print(f"READY http://127.0.0.1:{port}/stream", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
