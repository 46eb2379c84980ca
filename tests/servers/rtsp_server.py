"""A tiny live RTSP test server: a moving test pattern as H.264, 160x120 at 10 fps.

Run with Debian's interpreter, which carries the GStreamer bindings (a virtual environment
does not):

    /usr/bin/python3 tests/servers/rtsp_server.py PORT [MOUNT]

It listens on 127.0.0.1 only, prints ``READY rtsp://127.0.0.1:PORT/MOUNT`` once it serves and
stops cleanly on SIGTERM or SIGINT. Needs the packages of tests/servers/install-system-deps.sh.
"""

from __future__ import annotations

import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# is-live=true makes videotestsrc produce frames on the clock, like a camera; the short key-frame
# interval lets a client that (re)connects start decoding within one second.
LAUNCH = (
    "( videotestsrc is-live=true pattern=ball "
    "! video/x-raw,width=160,height=120,framerate=10/1 "
    "! videoconvert "
    "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 "
    "! rtph264pay name=pay0 pt=96 config-interval=1 )"
)

REQUIRED_ELEMENTS = ("videotestsrc", "videoconvert", "x264enc", "rtph264pay", "rtpbin")


def main(argv: list[str]) -> int:
    """Serve the test stream until a signal arrives.

    Args:
        argv: ``[PORT]`` or ``[PORT, MOUNT]``; MOUNT defaults to ``test``.

    Returns:
        The process exit status: 0 after a clean stop, 2 on bad arguments, 1 if a GStreamer
        element is missing or the port cannot be bound.
    """
    if not argv or not argv[0].isdigit():
        print("usage: rtsp_server.py PORT [MOUNT]", file=sys.stderr)
        return 2
    port = argv[0]
    mount = "/" + (argv[1] if len(argv) > 1 else "test").lstrip("/")

    Gst.init(None)
    # The media pipeline is built only when a client connects; check its elements now so a
    # missing plugin package fails here, with a name, instead of as a client-side open error.
    missing = [e for e in REQUIRED_ELEMENTS if Gst.ElementFactory.find(e) is None]
    if missing:
        print(f"missing GStreamer elements: {', '.join(missing)}; run "
              "tests/servers/install-system-deps.sh", file=sys.stderr)
        return 1
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(LAUNCH)
    # One pipeline for all clients, so a reconnecting client joins the running stream.
    factory.set_shared(True)
    server.get_mount_points().add_factory(mount, factory)

    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{port}", file=sys.stderr)
        return 1

    loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, loop.quit)
    print(f"READY rtsp://127.0.0.1:{port}{mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
