use super::*;

fn re(glob: &str) -> String {
    glob_to_regex(glob)
        .map(|r| r.as_str().to_string())
        .unwrap_or_else(|e| e)
}

#[test]
fn globs_translate_as_rclone_translates_them() {
    for (glob, want) in [
        ("", "(^|/)$"),
        ("potato", "(^|/)potato$"),
        ("potato,sausage", "(^|/)potato,sausage$"),
        ("/potato", "^potato$"),
        ("potato?sausage", "(^|/)potato[^/]sausage$"),
        ("potat[a-z]or", "(^|/)potat[a-z]or$"),
        ("potat[[:alpha:]]or", "(^|/)potat[[:alpha:]]or$"),
        (
            "'.' '+' '(' ')' '|' '^' '$'",
            r"(^|/)'\.' '\+' '\(' '\)' '\|' '\^' '\$'$",
        ),
        ("*.jpg", r"(^|/)[^/]*\.jpg$"),
        ("a{b,c,d}e", "(^|/)a(b|c|d)e$"),
        ("potato**sausage", "(^|/)potato.*sausage$"),
        (r"[\[\]]", r"(^|/)[\[\]]$"),
        ("*.{jpg,png,gif}", r"(^|/)[^/]*\.(jpg|png|gif)$"),
        (r"a\*b", r"(^|/)a\*b$"),
        (r"a\\b", r"(^|/)a\\b$"),
        ("a{{.*}}b", "(^|/)a(.*)b$"),
        (r"\{{{regexp}}", r"(^|/)\{(regexp)$"),
        (r"/{{\d{8}}}", r"^(\d{8})$"),
        (r"/{{\}}}", r"^(\})$"),
    ] {
        assert_eq!(re(glob), want, "{glob}");
    }
    for (glob, error) in [
        ("***potato", "too many stars"),
        ("ab]c", "mismatched ']'"),
        ("ab[c", "mismatched '[' and ']'"),
        ("ab{x{cd", "can't nest"),
        ("ab{}}cd", "mismatched '{' and '}'"),
        ("ab{c", "mismatched '{' and '}'"),
        ("a{{.*}", "mismatched '{{' and '}}'"),
    ] {
        assert!(re(glob).contains(error), "{glob}: {}", re(glob));
    }
}

#[test]
fn file_globs_imply_the_directories_they_need() {
    for (glob, want) in [
        ("*", vec!["/**"]),
        ("/*.jpg", vec!["/"]),
        ("///*.jpg", vec!["/"]),
        ("/a/b/*.jpg", vec!["/a/b/", "/a/", "/"]),
        ("a/b/*.jpg", vec!["a/b/", "a/"]),
        ("*/*/*.jpg", vec!["*/*/", "*/"]),
        ("a/{a,a*b,a**c}/d/", vec!["/**"]),
        ("**", vec!["**/"]),
        ("a**b**c**d", vec!["a**b**c**/", "a**b**/", "a**/"]),
        (
            "/var/spool/**/ncw",
            vec!["/var/spool/**/", "/var/spool/", "/var/", "/"],
        ),
        ("/sausage3**", vec!["/sausage3**/", "/"]),
    ] {
        assert_eq!(dir_globs(glob), want, "{glob}");
    }
}

fn spec(include: &[&str], exclude: &[&str]) -> FilterSpec {
    FilterSpec {
        include: include.iter().map(|s| s.to_string()).collect(),
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
        ..FilterSpec::default()
    }
}

fn taken(f: &Filter, path: &str) -> bool {
    let now = SystemTime::now();
    f.file_excluded(path, 10, now, now).is_none()
}

#[test]
fn star_stays_in_a_name_and_double_star_crosses_names() {
    let f = Filter::new(&spec(&[], &["/a/*.tmp"])).unwrap();
    assert!(!taken(&f, "a/x.tmp"));
    assert!(taken(&f, "a/b/x.tmp"), "* does not cross /");
    assert!(taken(&f, "b/a/x.tmp"), "anchored at the root");
    let f = Filter::new(&spec(&[], &["/a/**.tmp"])).unwrap();
    assert!(!taken(&f, "a/b/c/x.tmp"));
    let f = Filter::new(&spec(&[], &["*.tmp"])).unwrap();
    assert!(
        !taken(&f, "x.tmp") && !taken(&f, "deep/er/x.tmp"),
        "unanchored: any depth"
    );
    assert!(taken(&f, "x.tmpx") && taken(&f, "x.tmp/y"));
    let f = Filter::new(&spec(&[], &["b/c.csv"])).unwrap();
    assert!(!taken(&f, "a/b/c.csv") && !taken(&f, "b/c.csv"));
    assert!(taken(&f, "ab/c.csv"), "matches whole names from the end");
}

#[test]
fn include_excludes_everything_else_and_the_first_match_wins() {
    let f = Filter::new(&spec(&["*.csv"], &["secret*"])).unwrap();
    assert!(taken(&f, "x/y.csv"));
    assert!(taken(&f, "secret.csv"), "the include comes first and wins");
    assert!(
        !taken(&f, "y.bin"),
        "an include excludes what it does not match"
    );
    let f = Filter::new(&spec(&[], &["secret*"])).unwrap();
    assert!(
        taken(&f, "y.bin"),
        "without an include, unmatched files are taken"
    );
}

#[test]
fn filter_from_lines_add_clear_and_comment() {
    let text = "# comment\n; also\n\n- *.csv\n!\n+ *.csv\n  - *  \n";
    let f = Filter::from_lines(text, "rules").unwrap();
    assert!(taken(&f, "d/a.csv"), "! cleared the rule before it");
    assert!(!taken(&f, "a.bin"));
    assert!(!taken(&f, "a.parquet"));
    let why = f
        .file_excluded("a.parquet", 1, SystemTime::now(), SystemTime::now())
        .unwrap();
    assert_eq!(why, "excluded by - * (rules:7)");
    assert!(Filter::from_lines("*.csv\n", "rules").is_err());
}

#[test]
fn an_excluded_directory_hides_every_file_under_it() {
    let f = Filter::from_lines("- /b/secret/\n+ **.csv\n- **\n", "r").unwrap();
    assert!(!taken(&f, "b/secret/x.csv"));
    assert!(taken(&f, "b/public/x.csv"));
    // An anchored include with a directory: other top-level directories are not walked.
    let f = Filter::new(&spec(&["{a,b}/*.csv"], &[])).unwrap();
    assert!(taken(&f, "a/x.csv"));
    assert!(
        !taken(&f, "x/a/y.csv"),
        "x/ is not a directory the include needs"
    );
}

#[test]
fn sizes_are_kib_by_default_and_both_bounds_inclusive() {
    assert_eq!(parse_size("1").unwrap(), Some(1024));
    assert_eq!(parse_size("10B").unwrap(), Some(10));
    assert_eq!(parse_size("1.5M").unwrap(), Some(1_572_864));
    assert_eq!(parse_size("2Ki").unwrap(), Some(2048));
    assert_eq!(parse_size("2KiB").unwrap(), Some(2048));
    assert_eq!(parse_size("1G").unwrap(), Some(1 << 30));
    assert_eq!(parse_size("off").unwrap(), None);
    assert!(parse_size("1X").is_err() && parse_size("").is_err() && parse_size("-1").is_err());
    let f = Filter::new(&FilterSpec {
        min_size: Some("1".into()),
        max_size: Some("2K".into()),
        ..FilterSpec::default()
    })
    .unwrap();
    let now = SystemTime::now();
    let size = |n| f.file_excluded("f", n, now, now).is_none();
    assert!(!size(1023) && size(1024) && size(2048) && !size(2049));
}

#[test]
fn ages_are_seconds_by_default_and_max_age_drops_older_files() {
    let ago = |t: &str| match parse_age(t).unwrap() {
        Some(Age::Ago(d)) => d.as_secs_f64(),
        other => panic!("{t}: {other:?}"),
    };
    assert_eq!(ago("90"), 90.0);
    assert_eq!(ago("1.5h"), 5400.0);
    assert_eq!(ago("1h30m"), 5400.0);
    assert_eq!(ago("300ms"), 0.3);
    assert_eq!(ago("2d"), 172_800.0);
    assert_eq!(ago("1w"), 604_800.0);
    assert_eq!(ago("1M"), 2_592_000.0);
    assert_eq!(ago("1y"), 31_536_000.0);
    assert_eq!(ago("1m"), 60.0, "m is minutes, M months");
    assert!(matches!(parse_age("2020-01-02").unwrap(), Some(Age::At(_))));
    assert!(matches!(
        parse_age("2020-01-02T03:04:05Z").unwrap(),
        Some(Age::At(_))
    ));
    assert!(parse_age("soon").is_err());
    let f = Filter::new(&FilterSpec {
        max_age: Some("2d".into()),
        min_age: Some("1d".into()),
        ..FilterSpec::default()
    })
    .unwrap();
    let now = SystemTime::now();
    let hours = |h: u64| now - Duration::from_secs(h * 3600);
    let age = |h| f.file_excluded("f", 1, hours(h), now);
    assert!(age(49).unwrap().contains("--max-age 2d"));
    assert!(age(30).is_none());
    assert!(age(2).unwrap().contains("--min-age 1d"));
    let wrong = FilterSpec {
        max_age: Some("1d".into()),
        min_age: Some("2d".into()),
        ..FilterSpec::default()
    };
    assert!(Filter::new(&wrong).is_err());
}

#[test]
fn apply_takes_out_excluded_files_with_their_paths_under_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.tmp"), b"x").unwrap();
    std::fs::write(dir.path().join("sub/b.csv"), b"x").unwrap();
    let mut found = crate::discover(dir.path()).unwrap();
    let f = Filter::new(&spec(&[], &["/batch/sub/*.tmp"])).unwrap();
    let out = f.apply(&mut found, "batch", SystemTime::now());
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].path, "batch/sub/a.tmp");
    assert_eq!(out[0].reason, "excluded by --exclude /batch/sub/*.tmp");
    let kept: Vec<_> = found.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(kept, ["sub/b.csv"]);
}

proptest::proptest! {
    #[test]
    fn no_pattern_makes_it_panic(glob in "\\PC{0,24}", path in "[a-z/.*{}\\[\\]]{0,16}") {
        let _ = glob_to_regex(&glob);
        let _ = dir_globs(&glob);
        if let Ok(f) = Filter::from_lines(&format!("+ {glob}\n- {glob}/\n"), "p") {
            let now = SystemTime::now();
            let _ = f.file_excluded(&path, 0, now, now);
        }
        let _ = parse_size(&glob);
        let _ = parse_age(&glob);
    }
}
