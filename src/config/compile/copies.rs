//! A copy-limited resource (docs/design.md#copy-limits): its domain,
//! group and global limits, normalized (a limit above the global one is
//! lowered to it) and checked.

use std::collections::{HashMap, HashSet};

use serde_saphyr::Spanned;

use crate::config::raw::RawCopies;
use crate::config::{CopyGroup, CopyResource};

use super::Ctx;

impl Ctx {
    pub(super) fn copies(&mut self, name: &str, copies: &mut RawCopies) -> Option<CopyResource> {
        let errors_before = self.errors.len();
        let global_limit = copies
            .global_limit
            .as_ref()
            .and_then(|g| self.count(g, "global_limit"));
        let domain_limit = self.count(&copies.domain_limit, "domain_limit");
        let lowered = |ctx: &mut Ctx,
                       value: &mut Spanned<i64>,
                       count: Option<u64>,
                       what: String|
         -> u64 {
            let count = count.unwrap_or(0);
            match global_limit {
                Some(global) if count > global => {
                    ctx.note(
                        value.referenced,
                        format!("resource `{name}`: {what} {count} is above global_limit {global}; lowered to {global}"),
                    );
                    value.value = i64::try_from(global).unwrap_or(i64::MAX);
                    global
                }
                _ => count,
            }
        };
        let domain_limit = lowered(
            self,
            &mut copies.domain_limit,
            domain_limit,
            "domain_limit".into(),
        );
        let mut domains = HashMap::new();
        for (domain, limit) in &mut copies.domains {
            if self.control_character(limit.referenced, "domain name", domain) {
                continue;
            }
            let count = self.count(limit, "domain limit");
            let count = lowered(self, limit, count, format!("limit of domain `{domain}`"));
            domains.insert(domain.clone(), count);
        }
        let mut groups = Vec::new();
        let mut group_names = HashSet::new();
        for group in &mut copies.groups {
            let group = &mut group.value;
            let group_name = group.name.value.clone();
            if group_name.is_empty() {
                self.error(group.name.referenced, "group name is empty");
                continue;
            }
            if self.control_character(group.name.referenced, "group name", &group_name) {
                continue;
            }
            if !group_names.insert(group_name.clone()) {
                self.error(
                    group.name.referenced,
                    format!("duplicate group `{group_name}`"),
                );
                continue;
            }
            let count = self.count(&group.limit, "group limit");
            let limit = lowered(
                self,
                &mut group.limit,
                count,
                format!("limit of group `{group_name}`"),
            );
            groups.push(CopyGroup {
                name: group_name,
                limit,
                domains: group.domains.iter().cloned().collect(),
            });
        }
        (self.errors.len() == errors_before).then(|| CopyResource {
            name: name.to_owned(),
            domain_limit,
            global_limit,
            domains,
            groups,
        })
    }
}
