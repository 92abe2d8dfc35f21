"""What every end-to-end bench sets up: keys, relay tokens, and a running relay."""

import subprocess
import threading


def make_site(forte, work, site):
    """Keys in work/keys; tokens.toml with an edge token for `site` and a core token for all
    sites; the tokens themselves in work/edge.token and work/core.token."""
    subprocess.run([forte, "keygen", "--dir", work / "keys"], check=True, stdout=subprocess.DEVNULL)
    edge, core = f"{site}-edge-token-0123456789", f"{site}-core-token-0123456789"
    (work / "tokens.toml").write_text(
        f'[[token]]\ntoken = "{edge}"\nrole = "edge"\nsite = "{site}"\n'
        f'[[token]]\ntoken = "{core}"\nrole = "core"\nsites = ["*"]\n')
    (work / "edge.token").write_text(edge)
    (work / "core.token").write_text(core)


def add_edge_site(forte, work, site, keys, token_file):
    """A second edge: its own keys in work/`keys` (the core's pair in them unused) and an edge
    token for `site`, added to tokens.toml and written to work/`token_file`."""
    subprocess.run([forte, "keygen", "--dir", work / keys], check=True, stdout=subprocess.DEVNULL)
    token = f"{site}-edge-token-0123456789"
    with open(work / "tokens.toml", "a") as tokens:
        tokens.write(f'[[token]]\ntoken = "{token}"\nrole = "edge"\nsite = "{site}"\n')
    (work / token_file).write_text(token)


def start_relay(forte, store, tokens, listen, stderr=subprocess.DEVNULL, flags=(), env=None):
    """Starts `forte relay` (with extra `flags`, in `env`); returns the process, its URL and its
    certificate fingerprint."""
    relay = subprocess.Popen([forte, "relay", "--listen", listen, "--store", store, "--tokens", tokens,
                              *flags],
                             stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    url = relay.stdout.readline().split()[-1]
    fingerprint = relay.stdout.readline().split()[-1].rstrip(")")
    # Keep reading its output so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in relay.stdout], daemon=True).start()
    return relay, url, fingerprint
