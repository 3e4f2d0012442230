//! The OpenAPI document is a contract: it is compared with `tests/golden/openapi.json`, so every change
//! to the API shows up as a reviewed diff. Regenerate with `UPDATE_GOLDEN=1 cargo test -p paddock-api`.

use std::path::Path;

#[test]
fn openapi_document_matches_the_golden_file() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/openapi.json");
    let mut actual = paddock_api::openapi()
        .to_pretty_json()
        .expect("the document serializes");
    actual.push('\n');
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (create it with UPDATE_GOLDEN=1 cargo test -p paddock-api)",
            golden.display()
        )
    });
    if expected != actual {
        let first_difference = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "the OpenAPI document differs from {} from line {}:\n  golden: {:?}\n  actual: {:?}\n\
             If the change is intended, regenerate with UPDATE_GOLDEN=1 cargo test -p paddock-api and \
             review the diff.",
            golden.display(),
            first_difference + 1,
            expected.lines().nth(first_difference),
            actual.lines().nth(first_difference),
        );
    }
}
