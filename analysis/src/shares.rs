//! Each function's self and total weight and share of a profile, and the unit they count.

use std::collections::HashMap;

use crate::profile::Profile;
use crate::wording::{function_name, NO_STACK};

/// What a profile's weights count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// On-CPU samples.
    Samples,
    /// Nanoseconds (on-CPU time plus off-CPU time).
    Nanoseconds,
    /// Bytes (allocated, or in use at the end).
    Bytes,
}

impl Unit {
    /// The unit of `profile`'s weights.
    pub fn of(profile: &Profile) -> Unit {
        let events = profile.meta.events;
        if events.in_bytes() {
            Unit::Bytes
        } else if events.in_nanoseconds() {
            Unit::Nanoseconds
        } else {
            Unit::Samples
        }
    }

    /// Its name in JSON reports: `samples`, `nanoseconds`, `bytes`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Samples => "samples",
            Unit::Nanoseconds => "nanoseconds",
            Unit::Bytes => "bytes",
        }
    }
}

/// One function of a profile and its weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionWeight {
    /// [`function_name`].
    pub name: String,
    /// Weight of the samples whose leaf frame is this function.
    pub self_weight: u64,
    /// Weight of the samples with this function anywhere in the stack.
    pub total_weight: u64,
}

/// Every function of a profile, most self weight first (then most total, then by name).
#[derive(Debug, Clone, PartialEq)]
pub struct Functions {
    /// What the weights count.
    pub unit: Unit,
    /// The profile's total weight.
    pub total: u64,
    /// How many samples the total stands for (see the module's Noise section).
    pub events: f64,
    /// The functions.
    pub rows: Vec<FunctionWeight>,
}

impl Functions {
    /// The functions of `profile`.
    pub fn of(profile: &Profile) -> Functions {
        // Frame index -> function index, each name made once.
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut rows: Vec<FunctionWeight> = Vec::new();
        let mut intern = |name: String, rows: &mut Vec<FunctionWeight>| {
            *index.entry(name.clone()).or_insert_with(|| {
                rows.push(FunctionWeight {
                    name,
                    self_weight: 0,
                    total_weight: 0,
                });
                (rows.len() - 1) as u32
            })
        };
        let function_of: Vec<u32> = profile
            .frames
            .iter()
            .map(|f| intern(function_name(f), &mut rows))
            .collect();
        let no_stack = intern(NO_STACK.to_string(), &mut rows);
        // The last sample that counted each function, so recursion counts once.
        let mut counted: Vec<usize> = vec![usize::MAX; rows.len()];
        let mut total = 0u64;
        for (i, s) in profile.samples.iter().enumerate() {
            let w = profile.weight(s);
            if w == 0 {
                continue;
            }
            total = total.saturating_add(w);
            let leaf = s
                .frames
                .last()
                .map_or(no_stack, |&f| function_of[f as usize]);
            let row = &mut rows[leaf as usize];
            row.self_weight = row.self_weight.saturating_add(w);
            if s.frames.is_empty() {
                row.total_weight = row.total_weight.saturating_add(w);
            }
            for &f in &s.frames {
                let func = function_of[f as usize] as usize;
                if counted[func] != i {
                    counted[func] = i;
                    rows[func].total_weight = rows[func].total_weight.saturating_add(w);
                }
            }
        }
        rows.retain(|r| r.total_weight > 0);
        rows.sort_by(|a, b| {
            b.self_weight
                .cmp(&a.self_weight)
                .then(b.total_weight.cmp(&a.total_weight))
                .then_with(|| a.name.cmp(&b.name))
        });
        let unit = Unit::of(profile);
        let per_sample = match unit {
            Unit::Samples => 1,
            Unit::Nanoseconds => profile.meta.period_ns(),
            Unit::Bytes => profile.meta.events.alloc_rate,
        }
        .max(1);
        Functions {
            unit,
            total,
            events: total as f64 / per_sample as f64,
            rows,
        }
    }

    /// `weight` as a share of the total (0 for an empty profile).
    pub fn share(&self, weight: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            weight as f64 / self.total as f64
        }
    }

    /// The row of the function named `name`.
    pub fn get(&self, name: &str) -> Option<&FunctionWeight> {
        self.rows.iter().find(|r| r.name == name)
    }
}
