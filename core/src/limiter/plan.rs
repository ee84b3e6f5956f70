//! All or nothing: from each hit's own verdict to the request's verdict and what consumes.
//!
//! A descriptor is admitted when every one of its hits is. The request is denied when an
//! enforced descriptor is denied, or when it has quota-mode descriptors and all of them are
//! denied (a descriptor in both quota and shadow mode is one that never is); shadow
//! descriptors never deny it. When the request is admitted, the hits of admitted
//! descriptors consume; nothing else does, except hits whose limit has `charge: always`, which
//! always consume. Every backend follows this one function (the Lua script mirrors it).

use smallvec::SmallVec;

use super::{Hit, Role};

/// What a batch does once every hit has been evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The request is admitted.
    pub admitted: bool,
    /// Per hit: its cost is taken (or given back, for a refund).
    pub consume: Vec<bool>,
}

/// Plans a batch from each hit's own verdict (`admitted[i]` for `hits[i]`).
pub fn plan(hits: &[Hit], admitted: &[bool]) -> Plan {
    let groups = group_verdicts(hits, admitted);
    let mut quota_seen = false;
    let mut quota_admitted = false;
    let mut enforced_denied = false;
    for &(_, role, ok) in &groups {
        match role {
            Role::Enforced => enforced_denied |= !ok,
            Role::Quota => {
                quota_seen = true;
                quota_admitted |= ok;
            }
            Role::QuotaShadow => {
                quota_seen = true;
                quota_admitted = true;
            }
            Role::Shadow => {}
        }
    }
    let request_ok = !enforced_denied && (!quota_seen || quota_admitted);
    let consume = hits
        .iter()
        .map(|h| {
            let group_ok = find(&groups, h.group).is_some_and(|g| g.2);
            h.limit.takes_when_denied() || (request_ok && group_ok)
        })
        .collect();
    Plan {
        admitted: request_ok,
        consume,
    }
}

/// Per descriptor index (`group`): its role and whether all its hits were admitted.
type Groups = SmallVec<[(usize, Role, bool); 16]>;

/// The verdict of each group, in order of first appearance. A request has few descriptors and
/// the engine emits a descriptor's hits together, so a search from the newest group finds a
/// hit's group at once; any order of groups is still right.
fn group_verdicts(hits: &[Hit], admitted: &[bool]) -> Groups {
    let mut groups = Groups::new();
    for (hit, &ok) in hits.iter().zip(admitted) {
        match groups.iter_mut().rev().find(|g| g.0 == hit.group) {
            Some(g) => g.2 &= ok,
            None => groups.push((hit.group, hit.role, ok)),
        }
    }
    groups
}

fn find(groups: &Groups, group: usize) -> Option<&(usize, Role, bool)> {
    groups.iter().rev().find(|g| g.0 == group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::Charge;

    fn hit(group: usize, role: Role, charge: Charge) -> Hit {
        crate::limiter::funnel_hit("k", group, role, charge, 1, 1)
    }

    #[test]
    fn one_enforced_denial_denies_all_but_charge_always() {
        let hits = [
            hit(0, Role::Enforced, Charge::Admitted),
            hit(0, Role::Enforced, Charge::Always),
            hit(1, Role::Enforced, Charge::Admitted),
        ];
        let p = plan(&hits, &[true, true, false]);
        assert!(!p.admitted);
        assert_eq!(p.consume, vec![false, true, false]);
    }

    #[test]
    fn shadow_denial_neither_denies_nor_consumes_itself() {
        let hits = [
            hit(0, Role::Shadow, Charge::Admitted),
            hit(0, Role::Shadow, Charge::Admitted),
            hit(1, Role::Enforced, Charge::Admitted),
        ];
        let p = plan(&hits, &[true, false, true]);
        assert!(p.admitted);
        assert_eq!(p.consume, vec![false, false, true]);
    }

    #[test]
    fn quota_mode_denies_only_when_every_quota_descriptor_does() {
        let hits = [
            hit(0, Role::Quota, Charge::Admitted),
            hit(1, Role::Quota, Charge::Admitted),
        ];
        let some = plan(&hits, &[false, true]);
        assert!(some.admitted);
        assert_eq!(some.consume, vec![false, true]);
        let none = plan(&hits, &[false, false]);
        assert!(!none.admitted);
        assert_eq!(none.consume, vec![false, false]);
    }

    /// A descriptor in quota and shadow mode counts among the quota descriptors as one that
    /// passes: while it is in the request, quota mode cannot deny it.
    #[test]
    fn a_shadow_quota_descriptor_keeps_quota_mode_from_denying() {
        let hits = [
            hit(0, Role::Quota, Charge::Admitted),
            hit(1, Role::QuotaShadow, Charge::Admitted),
        ];
        let p = plan(&hits, &[false, false]);
        assert!(p.admitted);
        assert_eq!(
            p.consume,
            vec![false, false],
            "a denied descriptor takes nothing"
        );
        let enforced = [hits[1].clone(), hit(2, Role::Enforced, Charge::Admitted)];
        assert!(
            !plan(&enforced, &[true, false]).admitted,
            "an enforced denial still denies"
        );
    }

    #[test]
    fn interleaved_groups_are_still_each_one_verdict() {
        let hits = [
            hit(0, Role::Enforced, Charge::Admitted),
            hit(1, Role::Enforced, Charge::Admitted),
            hit(0, Role::Enforced, Charge::Admitted),
            hit(1, Role::Shadow, Charge::Admitted),
        ];
        let p = plan(&hits, &[true, true, false, true]);
        assert!(!p.admitted, "group 0 is denied by its second hit");
        assert_eq!(p.consume, vec![false; 4]);
        let p = plan(&hits, &[true, true, true, true]);
        assert!(p.admitted);
        assert_eq!(p.consume, vec![true; 4]);
    }

    #[test]
    fn any_group_number_is_fine() {
        let hits = [hit(usize::MAX, Role::Enforced, Charge::Admitted)];
        assert!(!plan(&hits, &[false]).admitted);
    }

    #[test]
    fn empty_batch_is_admitted() {
        assert!(plan(&[], &[]).admitted);
    }
}
