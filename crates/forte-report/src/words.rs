//! The KPIs' symbols (FORTE §2.2's) with their names and meanings in words: what `forte report`
//! and the dashboard's `/report` print beside each symbol they use.

/// One symbol of the paper, named and explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kpi {
    /// As the paper and the text output write it: `R_P`.
    pub symbol: &'static str,
    /// As a web page writes it: `R<sub>P</sub>`.
    pub html: &'static str,
    /// Its name in words: `pipeline rate`.
    pub name: &'static str,
    /// One line on what it measures.
    pub meaning: &'static str,
}

impl Kpi {
    /// `R_P, pipeline rate: bytes delivered per second from …`.
    pub fn line(&self) -> String {
        format!("{}, {}: {}", self.symbol, self.name, self.meaning)
    }
}

pub const Q_SEND: Kpi = Kpi {
    symbol: "q_send",
    html: "q<sub>send</sub>",
    name: "queued at the edge",
    meaning: "seconds from the batch's arrival (its ready marker) to the start of its send",
};

pub const T_SEND: Kpi = Kpi {
    symbol: "t_send",
    html: "t<sub>send</sub>",
    name: "send time",
    meaning: "seconds the edge spent preparing and uploading the batch, until the relay sealed it",
};

pub const Q_RELAY: Kpi = Kpi {
    symbol: "q_relay",
    html: "q<sub>relay</sub>",
    name: "waiting at the relay",
    meaning: "seconds from the batch's seal at the relay to the core starting to pull it",
};

pub const T_PULL: Kpi = Kpi {
    symbol: "t_pull",
    html: "t<sub>pull</sub>",
    name: "pull time",
    meaning: "seconds the core spent downloading, verifying and delivering the batch",
};

pub const L_B: Kpi = Kpi {
    symbol: "l_b",
    html: "l<sub>b</sub>",
    name: "batch latency",
    meaning:
        "seconds from the batch's arrival to its delivery (q_send + t_send + q_relay + t_pull)",
};

pub const R_B: Kpi = Kpi {
    symbol: "R_b",
    html: "R<sub>b</sub>",
    name: "batch rate",
    meaning: "the batch's raw megabytes over its latency l_b",
};

pub const R_P: Kpi = Kpi {
    symbol: "R_P",
    html: "R<sub>P</sub>",
    name: "pipeline rate",
    meaning: "bytes delivered per second from the first send to the last delivery (the offered load, when batches came slower than the pipeline could take them)",
};

/// Every symbol, in the order the report uses them.
pub const KPIS: [Kpi; 7] = [Q_SEND, T_SEND, Q_RELAY, T_PULL, L_B, R_B, R_P];

/// The figures without a symbol, in words: the daily capacity and the late arrivals.
pub const DAILY_CAPACITY: &str = "daily capacity: raw bytes per second while a batch was being sent or pulled (idle time between batches left out), × 86 400 s";

pub const LATE_ARRIVALS: &str = "late arrivals: files that appeared in a batch after it was sent, sent as a follow-up into the same batch; left out of the batch's figures and the run's, each reported on its own";

/// The symbol of a text's token, if it is one (`l_b`, `R_P`).
pub fn of_symbol(token: &str) -> Option<&'static Kpi> {
    KPIS.iter().find(|k| k.symbol == token)
}

/// The tokens of `text` written like a symbol (a letter, `_`, letters: `l_b`, `q_relay`) that
/// it does not name and explain (`l_b, batch latency: …`): none, when every symbol it uses has
/// its words beside it.
pub fn unexplained(text: &str) -> Vec<String> {
    let looks_like_a_symbol = |t: &&str| {
        let mut parts = t.splitn(2, '_');
        let (Some(head), Some(tail)) = (parts.next(), parts.next()) else {
            return false;
        };
        head.len() == 1
            && head.chars().all(|c| c.is_ascii_alphabetic())
            && !tail.is_empty()
            && tail.chars().all(|c| c.is_ascii_alphabetic())
    };
    let mut missing: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(looks_like_a_symbol)
        .filter(|t| of_symbol(t).is_none_or(|k| !text.contains(&k.line())))
        .map(str::to_owned)
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbol_without_its_words_is_found() {
        let explained = format!("q_send s\n{}\n", Q_SEND.line());
        assert!(unexplained(&explained).is_empty());
        assert_eq!(unexplained("R_P = 3.0 MB/s"), ["R_P"]);
        assert_eq!(
            unexplained("q_pull 0.1"),
            ["q_pull"],
            "not a symbol the report knows"
        );
        assert!(
            unexplained("run_1 of bags/raw_data.bag").is_empty(),
            "names are not symbols"
        );
    }
}
