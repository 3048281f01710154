//! Writes the synthetic corpus as JSON lines.
//!
//! ```text
//! make-corpus --texts 100000 [--seed 1] [--out corpus.jsonl]   (stdout without --out)
//! ```

use std::io::Write;

fn main() -> anyhow::Result<()> {
    let mut texts: u64 = 4000;
    let mut seed = flotilla_testkit::corpus::DEFAULT_SEED;
    let mut out: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--texts" => texts = value()?.parse()?,
            "--seed" => seed = value()?.parse()?,
            "--out" => out = Some(value()?),
            other => anyhow::bail!(
                "unknown flag {other}; usage: make-corpus --texts N [--seed S] [--out FILE]"
            ),
        }
    }
    let mut sink: Box<dyn Write> = match &out {
        Some(path) => Box::new(std::fs::File::create(path)?),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut buffered = std::io::BufWriter::new(&mut sink);
    flotilla_testkit::corpus::write_jsonl(&mut buffered, seed, texts)?;
    buffered.flush()?;
    Ok(())
}
