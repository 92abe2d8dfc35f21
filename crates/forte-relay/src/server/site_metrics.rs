//! The relay's metrics as a core token limited to some sites sees them: only what is about
//! those sites.
//!
//! The recorder is process-wide and renders every site's series, so the rendered text is
//! parsed back and cut down. A limited token keeps each sample whose `site` label names one of
//! its sites, and `forte_relay_held_bytes` recomputed as the sum of their
//! `forte_relay_site_held_bytes`. Every other series is left out, since none is about one site:
//! each counts the whole relay's activity (parts, bytes, seals, acknowledgements, rejections,
//! refusals, connections, the sites sending and the share in force), so even an unlabelled
//! total would tell such a token how much the other sites send. A family's `# HELP` and
//! `# TYPE` stay only if some of its samples do.

use anyhow::{bail, Context, Result};

/// The gauge of what the store holds, all sites: recomputed over the token's sites.
const HELD_TOTAL: &str = "forte_relay_held_bytes";
/// The per-site gauge it sums.
const HELD_BY_SITE: &str = "forte_relay_site_held_bytes";

/// `text` (Prometheus' text format) as a core token of `sites` (none of them `*`) may see it.
pub fn only_sites(text: &str, sites: &[String]) -> Result<String> {
    let families = families(text)?;
    // Folded from 0, not summed: an empty f64 sum is -0, which would render as "-0".
    let held = families
        .iter()
        .flat_map(|f| &f.samples)
        .filter(|s| s.metric == HELD_BY_SITE && s.site_among(sites))
        .fold(0.0, |sum, s| sum + s.value);
    let mut out = String::new();
    for family in &families {
        let kept: Vec<String> = family
            .samples
            .iter()
            .filter_map(|s| match s.metric {
                HELD_TOTAL if s.labels.is_empty() => Some(format!("{HELD_TOTAL} {held}")),
                _ if s.site_among(sites) => Some(s.line.to_owned()),
                _ => None,
            })
            .collect();
        if kept.is_empty() {
            continue;
        }
        for line in family
            .about
            .iter()
            .copied()
            .chain(kept.iter().map(String::as_str))
        {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    Ok(out)
}

/// One family: its `# HELP` and `# TYPE` lines, and its samples.
struct Family<'a> {
    name: &'a str,
    about: Vec<&'a str>,
    samples: Vec<Sample<'a>>,
}

/// One sample line, read.
struct Sample<'a> {
    line: &'a str,
    metric: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl Sample<'_> {
    fn site_among(&self, sites: &[String]) -> bool {
        self.labels
            .iter()
            .any(|(name, value)| *name == "site" && sites.contains(value))
    }
}

/// The families of `text` in their order. A sample belongs to the family last described if its
/// name is the family's, or the family's with a histogram's or summary's suffix; any other
/// starts a family without description.
fn families(text: &str) -> Result<Vec<Family<'_>>> {
    let mut families: Vec<Family> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = || format!("line {} of the relay's metrics: {line:?}", n + 1);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            let (Some("HELP" | "TYPE"), Some(name)) = (words.next(), words.next()) else {
                continue; // any other comment says nothing about a family
            };
            match families.last_mut() {
                Some(family) if family.name == name && family.samples.is_empty() => {
                    family.about.push(line)
                }
                _ => families.push(Family {
                    name,
                    about: vec![line],
                    samples: Vec::new(),
                }),
            }
            continue;
        }
        let sample = sample(line).with_context(at)?;
        match families.last_mut() {
            Some(family) if member_of(sample.metric, family.name) => family.samples.push(sample),
            _ => families.push(Family {
                name: sample.metric,
                about: Vec::new(),
                samples: vec![sample],
            }),
        }
    }
    Ok(families)
}

fn member_of(metric: &str, family: &str) -> bool {
    metric == family
        || metric
            .strip_prefix(family)
            .is_some_and(|suffix| ["_bucket", "_sum", "_count"].contains(&suffix))
}

/// A sample line: `name{label="value",…} value [timestamp]`, label values escaped as the
/// format says (`\\`, `\"`, `\n`).
fn sample(line: &str) -> Result<Sample<'_>> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let metric = &line[..end];
    if metric.is_empty() || metric.starts_with(|c: char| c.is_ascii_digit()) {
        bail!("no metric name");
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = read_labels(inside, &mut labels)?;
    }
    let value = rest
        .split_whitespace()
        .next()
        .context("no value after the metric's name and labels")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .with_context(|| format!("value {v:?} is not a number"))?,
    };
    Ok(Sample {
        line,
        metric,
        labels,
        value,
    })
}

/// Reads `label="value"` pairs up to the closing `}` into `labels`; what follows it.
fn read_labels<'a>(mut text: &'a str, labels: &mut Vec<(&'a str, String)>) -> Result<&'a str> {
    loop {
        text = text.trim_start();
        if let Some(after) = text.strip_prefix('}') {
            return Ok(after);
        }
        let (name, after) = text
            .split_once('=')
            .context("a label without `=` before the closing brace")?;
        let name = name.trim();
        let mut chars = after
            .trim_start()
            .strip_prefix('"')
            .with_context(|| format!("label {name}'s value is not quoted"))?
            .char_indices();
        let mut value = String::new();
        let rest = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => bail!("label {name}'s value has a bad escape {other:?}"),
                },
                Some((_, '"')) => break chars.as_str(),
                Some((_, c)) => value.push(c),
                None => bail!("label {name}'s value is not closed"),
            }
        };
        labels.push((name, value));
        text = rest.trim_start();
        text = text.strip_prefix(',').unwrap_or(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP forte_relay_held_bytes Bytes the store holds, all sites
# TYPE forte_relay_held_bytes gauge
forte_relay_held_bytes 30

# HELP forte_relay_site_held_bytes Bytes the store holds, by site
# TYPE forte_relay_site_held_bytes gauge
forte_relay_site_held_bytes{site=\"a\"} 10
forte_relay_site_held_bytes{site=\"b\"} 20

# HELP forte_relay_parts_stored_total Parts stored
# TYPE forte_relay_parts_stored_total counter
forte_relay_parts_stored_total 7

# HELP forte_relay_received_bytes_total Request bytes received, by site
# TYPE forte_relay_received_bytes_total counter
forte_relay_received_bytes_total{site=\"b\"} 5
forte_relay_received_bytes_total{note=\"site=\\\"a\\\", }\",site=\"b\"} 6
forte_relay_received_bytes_total{ site = \"a\" , } 4 1700000000
";

    fn a() -> Vec<String> {
        vec!["a".to_string()]
    }

    #[test]
    fn only_the_sites_series_stay_and_the_total_is_theirs() {
        let seen = only_sites(TEXT, &a()).unwrap();
        assert_eq!(
            seen,
            "\
# HELP forte_relay_held_bytes Bytes the store holds, all sites
# TYPE forte_relay_held_bytes gauge
forte_relay_held_bytes 10

# HELP forte_relay_site_held_bytes Bytes the store holds, by site
# TYPE forte_relay_site_held_bytes gauge
forte_relay_site_held_bytes{site=\"a\"} 10

# HELP forte_relay_received_bytes_total Request bytes received, by site
# TYPE forte_relay_received_bytes_total counter
forte_relay_received_bytes_total{ site = \"a\" , } 4 1700000000

"
        );
    }

    #[test]
    fn a_site_that_holds_nothing_sees_no_family_of_others() {
        let seen = only_sites(TEXT, &["c".to_string()]).unwrap();
        // The total is its own (0); nothing else of a or b, and no description left alone.
        assert_eq!(
            seen,
            "# HELP forte_relay_held_bytes Bytes the store holds, all sites\n\
             # TYPE forte_relay_held_bytes gauge\nforte_relay_held_bytes 0\n\n"
        );
    }

    #[test]
    fn a_histograms_samples_stay_with_their_family() {
        let text = "# TYPE t histogram\nt_bucket{site=\"a\",le=\"+Inf\"} 1\n\
                    t_sum{site=\"a\"} 2.5\nt_count{site=\"b\"} 1\nother{site=\"a\"} 3\n";
        let seen = only_sites(text, &a()).unwrap();
        assert_eq!(
            seen,
            "# TYPE t histogram\nt_bucket{site=\"a\",le=\"+Inf\"} 1\nt_sum{site=\"a\"} 2.5\n\n\
             other{site=\"a\"} 3\n\n"
        );
    }

    #[test]
    fn a_line_it_cannot_read_is_an_error_naming_it() {
        for bad in [
            "x{site=\"a} 1",
            "x{site=a} 1",
            "x{site=\"a\"}",
            "x 1e",
            "{site=\"a\"} 1",
        ] {
            let e = only_sites(bad, &a()).unwrap_err();
            assert!(
                format!("{e:#}").contains(&format!("line 1 of the relay's metrics: {bad:?}")),
                "{e:#}"
            );
        }
    }
}
