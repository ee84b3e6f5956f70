//! The arrows inside the core, checked: `engine -> { rules, limiter } -> config`, with `pem`
//! and `rng` beside them. A module may name (in code, not in its docs) only the modules below
//! it; the crate boundary keeps everything above the core out.

mod check;

use std::path::Path;

use check::{Table, named, wrong_arrows};

/// Each module, and the other core modules its code may name.
const ALLOWED: &Table = &[
    ("config", &[]),
    ("rules", &["config"]),
    ("limiter", &["config", "pem"]),
    ("engine", &["rules", "limiter", "config"]),
    ("pem", &[]),
    ("rng", &[]),
];

#[test]
fn every_module_names_only_the_modules_below_it() {
    let wrong = wrong_arrows(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), ALLOWED);
    assert!(
        wrong.is_empty(),
        "arrows against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_an_arrow_and_passes_over_a_comment() {
    assert_eq!(named(ALLOWED, "use crate::engine::Engine;"), vec!["engine"]);
    assert_eq!(
        named(
            ALLOWED,
            "    let x = crate::rules::key::f(crate::limiter::Y);"
        ),
        vec!["rules", "limiter"]
    );
    assert!(named(ALLOWED, "/// see [`crate::engine`]").is_empty());
    assert!(named(ALLOWED, "use crate::enginery;").is_empty());
}

#[test]
fn a_wrong_arrow_is_reported_with_its_file_and_line() {
    let dir = std::env::temp_dir().join(format!("sluice-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.rs"),
        "// crate::engine\nuse crate::engine::X;\n",
    )
    .unwrap();
    for m in ["rules", "limiter", "engine", "pem", "rng"] {
        std::fs::write(dir.join(format!("{m}.rs")), "").unwrap();
    }
    let wrong = wrong_arrows(&dir, ALLOWED);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(
        wrong[0].ends_with("config.rs:2: config -> engine"),
        "{wrong:?}"
    );
}
