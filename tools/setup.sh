#!/bin/sh
# Set up libshare on Debian: the system packages, a virtual environment, an editable install.
#
#   sh tools/setup.sh [run|test|bench] [--venv DIR]
#
#   run    (default) what `python -m libshare.demo` and the examples need
#   test   run, plus what the test suite needs (C compilers, Slurm and munge; the [test] extra)
#   bench  test, plus the [bench] extra
#   --venv DIR   the virtual environment to create or reuse (default: .venv in the repository)
#
# Runs as root or as a user with sudo: apt-get runs through sudo only when not root, and only
# when a package is missing, so a second run installs nothing and asks for no password.
# Safe to run again: it reuses the environment and reinstalls libshare into it (which rebuilds
# the C parts after a change). POSIX sh.
set -eu

mode=run
venv=
while [ $# -gt 0 ]; do
    case "$1" in
        run|test|bench) mode=$1 ;;
        --venv) [ $# -ge 2 ] || { echo "setup.sh: --venv needs a directory" >&2; exit 2; }
                venv=$2; shift ;;
        --venv=*) venv=${1#--venv=} ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown argument '$1' (run, test, bench, --venv DIR)" >&2; exit 2 ;;
    esac
    shift
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${venv:-$root/.venv}

# Debian packages. run: the Vulkan loader and headers, Mesa's lavapipe (a CPU Vulkan driver),
# the SPIR-V tools the arbiter needs, a C compiler, cJSON (the Vulkan driver reads the arbiter's
# JSON with it) and Python's venv and headers.
packages="libvulkan1 libvulkan-dev mesa-vulkan-drivers glslang-tools spirv-tools gcc libcjson-dev python3-venv python3-dev"
case "$mode" in
    test|bench) packages="$packages g++ pkg-config slurm-wlm munge vulkan-validationlayers spirv-headers" ;;
esac

missing=
for package in $packages; do
    if ! dpkg-query -W -f '${Status}\n' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $package"
    fi
done

if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        sudo=
    elif command -v sudo >/dev/null 2>&1; then
        sudo=sudo
    else
        echo "setup.sh: these Debian packages are missing:$missing" >&2
        echo "setup.sh: run this script as root, or install sudo, or install them and run it again" >&2
        exit 1
    fi
    echo "setup.sh: installing$missing" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi

case "$mode" in
    run) target=. ;;
    test) target='.[test]' ;;
    bench) target='.[test,bench]' ;;
esac
"$venv/bin/python" -m pip install -q -e "$target"
echo "setup.sh: ready ($mode) in $venv" >&2
