"""The host folders and files cdi-gen uses by default, named once.

Every command, the agent, the doctor and the kubelet plugin take these as defaults, so a
default changes in one place. Paths come from the kubelet (device plugin folder and its
socket), the CDI specification (the two spec folders a runtime reads), the runtimes (their
configs and CRI sockets) and udev.
"""

from __future__ import annotations

from pathlib import Path

#: Where cdi-gen writes its specs by default: the CDI folder for generated, transient specs.
DYNAMIC_SPEC_DIR = Path("/var/run/cdi")
#: The CDI folder for static specs (installed by packages or an administrator).
STATIC_SPEC_DIR = Path("/etc/cdi")
#: The folders a runtime reads by default, lowest priority first (a later folder wins).
RUNTIME_SPEC_DIRS: tuple[Path, ...] = (STATIC_SPEC_DIR, DYNAMIC_SPEC_DIR)
#: The kubelet's device plugin folder: our sockets go here, and the kubelet's own.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: The kubelet's registration socket, inside :data:`DEVICE_PLUGIN_DIR`.
KUBELET_SOCKET_NAME = "kubelet.sock"
#: The kubelet's plugin watcher folder: a DRA driver's registration socket goes here.
PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
#: The kubelet's plugin folder: a DRA driver serves ``<driver>/dra.sock`` under it.
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
#: The kubelet's pod-resources socket: which container holds which device (``whenBack``).
POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: cdi-gen's own state: the DRA driver's checkpoint of prepared claims.
STATE_DIR = Path("/var/lib/cdi-gen")
#: udevd's runtime folder: its control socket and the database with the ID_* properties.
UDEV_RUN_DIR = Path("/run/udev")
#: Container runtime configs the doctor reads.
CONTAINERD_CONFIG = Path("/etc/containerd/config.toml")
CRIO_CONFIG = Path("/etc/crio/crio.conf")
#: The runtimes' CRI sockets, asked for the runtime's name and version where its binary is
#: not visible (the agent in a pod).
CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")
CRIO_SOCKET = Path("/var/run/crio/crio.sock")
CRI_SOCKETS: tuple[Path, ...] = (CONTAINERD_SOCKET, CRIO_SOCKET)
