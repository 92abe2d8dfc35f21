//! Telling people about failures: a structured log line on stderr, and an optional command
//! (`--on-failure`) such as a mail or chat alert, as the papers' pipeline sent e-mails.

use std::process::Command;

use forte_catalog::Role;
use serde::Serialize;

use forte_catalog::format_utc;

/// Where failures are reported.
#[derive(Clone)]
pub struct Failures {
    pub role: Role,
    /// Run with `sh -c`; `FORTE_ROLE`, `FORTE_BATCH`, `FORTE_FILE` and `FORTE_ERROR` say what failed.
    pub command: Option<String>,
}

#[derive(Serialize)]
struct LogLine<'a> {
    at: String,
    level: &'static str,
    event: &'static str,
    role: Role,
    batch: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    error: &'a str,
}

impl Failures {
    pub fn report(&self, batch: &str, file: Option<&str>, error: &str) {
        crate::monitor::failure(self.role);
        let line = LogLine {
            at: format_utc(forte_catalog::now_us()),
            level: "error",
            event: "failure",
            role: self.role,
            batch,
            file,
            error,
        };
        eprintln!("{}", serde_json::to_string(&line).expect("serialises"));
        let Some(command) = &self.command else { return };
        let status = Command::new("sh")
            .arg("-c")
            .arg(command)
            .env("FORTE_ROLE", self.role.as_str())
            .env("FORTE_BATCH", batch)
            .env("FORTE_FILE", file.unwrap_or(""))
            .env("FORTE_ERROR", error)
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("warning: the --on-failure command exited with {s}"),
            Err(e) => eprintln!("warning: cannot run the --on-failure command: {e}"),
        }
    }
}
