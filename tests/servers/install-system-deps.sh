#!/bin/sh
# System packages for the live-input tests (tests/pipelines/test_live.py): the RTSP test server
# (tests/servers/rtsp_server.py) runs under Debian/Ubuntu's /usr/bin/python3 with GStreamer's RTSP
# server bindings. Pipeline elements: videotestsrc, videoconvert (plugins-base), x264enc
# (plugins-ugly), rtph264pay and rtpbin (plugins-good).
#
# Idempotent and quiet: does nothing when the bindings already import. Run as root or with sudo.
set -eu

PACKAGES="gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly"

# True when the bindings import and every element of the test pipeline exists.
probe() {
    /usr/bin/python3 - >/dev/null 2>&1 <<'PY'
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer  # noqa: F401
Gst.init(None)
elements = ("videotestsrc", "videoconvert", "x264enc", "rtph264pay", "rtpbin")
raise SystemExit(0 if all(Gst.ElementFactory.find(e) for e in elements) else 1)
PY
}

if [ -x /usr/bin/python3 ] && probe; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086  # word splitting of PACKAGES is intended
$SUDO apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
