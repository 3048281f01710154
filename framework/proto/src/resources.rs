//! What a node offers to run work: CPUs, memory, GPUs, named custom
//! resources and labels.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

/// Resources a node reports to the cluster.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Resources {
    /// Logical CPUs available to work.
    pub cpus: u32,
    /// Memory available to work, in bytes.
    pub memory_bytes: u64,
    /// GPUs available to work.
    pub gpus: u32,
    /// Custom labels from configuration (`zone = "a"`, `model = "minilm"`).
    pub labels: BTreeMap<String, String>,
    /// Named custom resources declared in configuration (`ssd = 2`,
    /// `tpu = 0.5`).
    pub custom: BTreeMap<String, f64>,
}

/// A resource declaration that cannot hold.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("resource {name}={amount}: {why}")]
pub struct BadResource {
    /// The resource.
    pub name: String,
    /// The amount given.
    pub amount: f64,
    /// Why.
    pub why: &'static str,
}

impl Resources {
    /// Sets `name` to `amount`: `cpu` and `gpu` (whole numbers),
    /// `memory_mb`, or a custom resource (any amount ≥ 0, fractions
    /// allowed). Replaces what was detected or declared before.
    pub fn declare(&mut self, name: &str, amount: f64) -> Result<(), BadResource> {
        let bad = |why| BadResource {
            name: name.to_owned(),
            amount,
            why,
        };
        if !amount.is_finite() || amount < 0.0 {
            return Err(bad("amounts are finite and not negative"));
        }
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(bad("names are letters, digits, '_', '-' and '.'"));
        }
        let whole = |what: &'static str| {
            if amount.fract() != 0.0 || amount > f64::from(u32::MAX) {
                Err(bad(what))
            } else {
                Ok(amount as u32)
            }
        };
        match name {
            "cpu" => self.cpus = whole("cpu is a whole number")?,
            "gpu" => self.gpus = whole("gpu is a whole number")?,
            "memory_mb" => self.memory_bytes = (amount * (1u64 << 20) as f64) as u64,
            _ => {
                self.custom.insert(name.to_owned(), amount);
            }
        }
        Ok(())
    }

    /// Every resource as an amount: `cpu`, `gpu`, `memory_mb` and the
    /// custom ones (what placement accounts).
    pub fn amounts(&self) -> BTreeMap<String, f64> {
        let mut all = self.custom.clone();
        all.insert("cpu".into(), f64::from(self.cpus));
        all.insert("gpu".into(), f64::from(self.gpus));
        all.insert(
            "memory_mb".into(),
            self.memory_bytes as f64 / (1u64 << 20) as f64,
        );
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_replace_detection_and_are_checked() {
        let mut r = Resources {
            cpus: 8,
            gpus: 1,
            ..Resources::default()
        };
        r.declare("cpu", 2.0).unwrap();
        r.declare("memory_mb", 512.0).unwrap();
        r.declare("ssd", 1.5).unwrap();
        assert_eq!((r.cpus, r.gpus, r.memory_bytes), (2, 1, 512 << 20));
        let amounts = r.amounts();
        assert_eq!(amounts["cpu"], 2.0);
        assert_eq!(amounts["ssd"], 1.5);
        assert_eq!(amounts["memory_mb"], 512.0);
        assert_eq!(
            r.declare("cpu", 0.5).unwrap_err().why,
            "cpu is a whole number"
        );
        assert!(r.declare("ssd", -1.0).is_err());
        assert!(r.declare("ssd", f64::NAN).is_err());
        assert!(r.declare("a b", 1.0).is_err());
        assert_eq!(r.cpus, 2, "a refused declaration changes nothing");
    }
}
