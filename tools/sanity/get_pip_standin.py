"""Stand-in for the get-pip.py bootstrap script that ansible-test downloads from a host this
machine cannot reach. ansible-test runs it as a module with pip-install style arguments plus
--no-setuptools/--no-wheel; we bootstrap pip from the standard library's ensurepip, then
install the requested packages (pip==<version>) from the reachable package index.
"""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))
