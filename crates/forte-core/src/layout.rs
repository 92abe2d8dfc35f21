//! Where a delivered file goes: a template such as `{site}/{batch}/{path}`.
//!
//! | field | value |
//! |---|---|
//! | `{site}` | the site the file came from |
//! | `{batch}` | the batch name |
//! | `{path}` | the file's path inside the batch |
//! | `{yyyy}` `{mm}` `{dd}` `{hh}` | UTC date and hour the batch arrived at the edge, as the edge signed it in every manifest (format 4; for older manifests, when it reached the relay) |
//! | `{date}` | `{yyyy}-{mm}-{dd}` |

use anyhow::{bail, Result};
use chrono::DateTime;
use forte_format::manifest::validate_path;

/// A parsed layout template.
#[derive(Debug, Clone)]
pub struct Layout {
    template: String,
}

/// The names at the top of a destination that are forte's own (`.forte-staging-*`,
/// `.forte-landing`, `.forte-quarantine`, `.forte-custody`, `.forte-replaced`).
const RESERVED_PREFIX: &str = ".forte-";

const FIELDS: [&str; 8] = ["site", "batch", "path", "yyyy", "mm", "dd", "hh", "date"];

/// The values of a layout's fields for one file.
pub struct Fields<'a> {
    pub site: &'a str,
    pub batch: &'a str,
    pub path: &'a str,
    /// Seconds since the Unix epoch.
    pub batch_time: u64,
}

impl Layout {
    pub fn parse(template: &str) -> Result<Self> {
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                bail!("layout {template:?} has an unclosed {{");
            };
            let field = &rest[open + 1..open + close];
            if !FIELDS.contains(&field) {
                bail!(
                    "layout {template:?} has an unknown field {{{field}}}; known: {}",
                    FIELDS.map(|f| format!("{{{f}}}")).join(" ")
                );
            }
            rest = &rest[open + close + 1..];
        }
        if !template.contains("{path}") {
            bail!("layout {template:?} must contain {{path}}, or files of a batch would collide");
        }
        let layout = Self {
            template: template.to_string(),
        };
        // Every file goes under the destination: what the template adds around the fields
        // must be relative and normalised for any values (checked here once, not per batch).
        let sample = layout.render(&Fields {
            site: "site",
            batch: "batch",
            path: "dir/file",
            batch_time: 0,
        });
        if let Err(why) = validate_path(&sample) {
            bail!(
                "layout {template:?} does not keep files inside the destination: file dir/file \
                 of batch \"batch\" from site \"site\" would go to {sample:?} ({why}); use a \
                 relative template without a leading '/' and without '..', '.' or empty \
                 components, such as {{site}}/{{batch}}/{{path}}"
            );
        }
        Ok(layout)
    }

    /// Where the file of `f` goes under the destination: the rendered template, refused when
    /// it lands among forte's own records there (a first component starting `.forte-`:
    /// staging, landing, quarantine, the delivered instances, replaced versions), where a
    /// batch under a layout such as `{path}` could otherwise write the core's records.
    pub fn target(&self, f: &Fields<'_>) -> Result<String> {
        let target = self.render(f);
        let first = target.split('/').next().unwrap_or_default();
        if first.starts_with(RESERVED_PREFIX) {
            bail!(
                "the layout puts file {} of batch {:?} of site {} at {target}, inside {first}, where forte keeps its own records at the destination: refused, nothing of the batch delivered (a batch may not write there; with a layout that starts with {{path}}, a file whose path starts with {RESERVED_PREFIX} cannot be delivered)",
                f.path,
                f.batch,
                f.site
            );
        }
        Ok(target)
    }

    pub fn render(&self, f: &Fields<'_>) -> String {
        let time = DateTime::from_timestamp(f.batch_time as i64, 0).unwrap_or_default();
        let field = |format: &str| time.format(format).to_string();
        self.template
            .replace("{site}", f.site)
            .replace("{batch}", f.batch)
            .replace("{date}", &field("%Y-%m-%d"))
            .replace("{yyyy}", &field("%Y"))
            .replace("{mm}", &field("%m"))
            .replace("{dd}", &field("%d"))
            .replace("{hh}", &field("%H"))
            .replace("{path}", f.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No file of a batch goes among forte's own records at the destination, whatever the
    /// layout; a name that only starts like them deeper down is the batch's own.
    #[test]
    fn a_target_among_fortes_records_is_refused() {
        let layout = Layout::parse("{path}").unwrap();
        let at = |path: &str| {
            layout.target(&Fields {
                site: "site-b",
                batch: "run9",
                path,
                batch_time: 0,
            })
        };
        for reserved in [
            ".forte-custody/site-a/x.json",
            ".forte-replaced/a",
            ".forte-staging-h-1-0/f",
        ] {
            let why = at(reserved).unwrap_err().to_string();
            assert!(why.contains("where forte keeps its own records"), "{why}");
        }
        assert_eq!(
            at("data/.forte-custody/x").unwrap(),
            "data/.forte-custody/x"
        );
        assert_eq!(at(".forte/x").unwrap(), ".forte/x");
    }

    #[test]
    fn layouts_render_and_reject_unknown_fields() {
        let l = Layout::parse("{site}/{yyyy}/{mm}/{dd}/{batch}/{path}").unwrap();
        let f = Fields {
            site: "mine-7",
            batch: "run-42",
            path: "a/b.bag",
            batch_time: 1_795_305_600,
        };
        assert_eq!(l.render(&f), "mine-7/2026/11/22/run-42/a/b.bag");
        assert_eq!(
            Layout::parse("{date}T{hh}/{path}").unwrap().render(&f),
            "2026-11-22T00/a/b.bag"
        );
        assert!(Layout::parse("{site}/{vehicle}/{path}")
            .unwrap_err()
            .to_string()
            .contains("{vehicle}"));
        assert!(Layout::parse("{site}/{batch}").is_err());
        let leap_day = Fields {
            batch_time: 951_782_400,
            ..f
        };
        assert_eq!(
            Layout::parse("{date}/{path}").unwrap().render(&leap_day),
            "2000-02-29/a/b.bag"
        );
    }

    #[test]
    fn layouts_that_leave_the_destination_are_refused_at_parse() {
        for bad in [
            "../{path}",
            "../x/{path}",
            "/abs/{path}",
            "{site}/../{path}",
            "{site}//{path}",
            "./{path}",
            "{path}/..",
            "{site}/{batch}/{path}/",
        ] {
            let e = Layout::parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            let e = e.to_string();
            assert!(
                e.contains(&format!("layout {bad:?}")) && e.contains("{site}/{batch}/{path}"),
                "{e}"
            );
        }
        let e = Layout::parse("{site}/{batch}").unwrap_err().to_string();
        assert!(e.contains("must contain {path}"), "{e}");
        for good in [
            "{path}",
            "{site}/{batch}/{path}",
            "in/{date}/{batch}-{path}",
        ] {
            Layout::parse(good).unwrap();
        }
    }
}
