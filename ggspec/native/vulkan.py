"""What a Vulkan build needs, checked before cmake's configure, and how to see a CPU Vulkan device.

ggml-vulkan's configure wants the Vulkan headers and loader, `glslc` (every shader is compiled at
build time) and SPIRV-Headers' CMake package; a missing one fails minutes into a build with a
CMake error that names none of the packages. Here it is one line naming them (Debian / Ubuntu
package names; a LunarG SDK under `$VULKAN_SDK` is searched first).

Mesa's lavapipe (`mesa-vulkan-drivers`) is a conformant Vulkan device that runs on the CPU: what
the tests run the Vulkan kernels on where there is no GPU. llama.cpp ignores CPU-type Vulkan
devices unless `GGML_VK_VISIBLE_DEVICES` names them (ggml-vulkan.cpp, ggml_vk_instance_init).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ggspec.native.errors import BuildError

DEBIAN_PACKAGES = "libvulkan-dev glslc spirv-headers"
DEVICE_PACKAGE = "mesa-vulkan-drivers"  # lavapipe: a Vulkan device on the CPU
VISIBLE_DEVICES_ENV = "GGML_VK_VISIBLE_DEVICES"

_PREFIXES = (Path("/usr"), Path("/usr/local"))
_CMAKE_DIRS = ("share/cmake", "lib/cmake", "lib64/cmake", "lib/x86_64-linux-gnu/cmake", "lib/aarch64-linux-gnu/cmake")


@dataclass(frozen=True)
class VulkanSdk:
    include_dir: Path  # holds vulkan/vulkan.h
    glslc: Path
    spirv_headers: Path  # SPIRV-HeadersConfig.cmake's folder


def _prefixes() -> list[Path]:
    sdk = os.environ.get("VULKAN_SDK")
    return ([Path(sdk)] if sdk else []) + list(_PREFIXES)


def _headers() -> Path | None:
    for prefix in _prefixes():
        if (prefix / "include" / "vulkan" / "vulkan.h").is_file():
            return prefix / "include"
    return None


def _glslc() -> Path | None:
    sdk = os.environ.get("VULKAN_SDK")
    if sdk and (Path(sdk) / "bin" / "glslc").is_file():
        return Path(sdk) / "bin" / "glslc"
    found = shutil.which("glslc")
    return Path(found) if found else None


def _spirv_headers() -> Path | None:
    for prefix in _prefixes():
        for sub in _CMAKE_DIRS:
            folder = prefix / sub / "SPIRV-Headers"
            if (folder / "SPIRV-HeadersConfig.cmake").is_file():
                return folder
    return None


def find_sdk() -> VulkanSdk:
    """The Vulkan build requirements found here; BuildError names the missing ones."""
    headers, glslc, spirv = _headers(), _glslc(), _spirv_headers()
    missing = [what for what, found in (("the Vulkan headers and loader (libvulkan-dev)", headers),
                                        ("glslc", glslc), ("SPIRV-Headers (spirv-headers)", spirv)) if found is None]
    if missing:
        raise BuildError(f"--vulkan needs {', '.join(missing)}: on Debian or Ubuntu, "
                         f"`apt-get install {DEBIAN_PACKAGES}` (and {DEVICE_PACKAGE} for a Vulkan device on the CPU)")
    return VulkanSdk(include_dir=headers, glslc=glslc, spirv_headers=spirv)  # type: ignore[arg-type]
