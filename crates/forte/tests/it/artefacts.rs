//! What the release packages carry, generated from the CLI definition: the manual pages
//! (`forte man DIR`) and the shell completions (`forte completions SHELL`).

use crate::common::*;

#[test]
fn man_writes_a_page_for_forte_and_each_visible_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    ok(&args!["man", &dir]);
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    for page in [
        "forte.1",
        "forte-send.1",
        "forte-pull.1",
        "forte-relay.1",
        "forte-relay-store.1",
        "forte-completions.1",
        "forte-bench-compress.1",
    ] {
        assert!(pages.contains(&page.to_string()), "{page} in {pages:?}");
    }
    // The hidden command and clap's `help` get no page.
    assert!(!pages.contains(&"forte-man.1".to_string()), "{pages:?}");
    assert!(!pages.contains(&"forte-help.1".to_string()), "{pages:?}");
    let forte = std::fs::read_to_string(dir.join("forte.1")).unwrap();
    assert!(forte.starts_with(".ie"), "roff: {forte:.200}");
    assert!(forte.contains(".SH SYNOPSIS"), "{forte}");
    assert!(forte.contains("forte\\-send(1)"), "{forte}");
    let send = std::fs::read_to_string(dir.join("forte-send.1")).unwrap();
    assert!(send.contains(".TH forte-send 1  \"forte "), "{send:.300}");
    assert!(send.contains("\\-\\-watch"), "{send}");
}

#[test]
fn completions_print_each_shells_script() {
    let bash = ok(&args!["completions", "bash"]);
    assert!(bash.contains("complete -F _forte"), "{bash:.500}");
    assert!(bash.contains("relay-store"), "subcommands are completed");
    let zsh = ok(&args!["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef forte"), "{zsh:.200}");
    let fish = ok(&args!["completions", "fish"]);
    assert!(fish.contains("complete -c forte"), "{fish:.300}");
    for shell in ["elvish", "powershell"] {
        assert!(!ok(&args!["completions", shell]).is_empty(), "{shell}");
    }
    let out = run(&args!["completions", "tcsh"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("possible values"), "{err}");
}
