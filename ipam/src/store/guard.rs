//! Every guarded write, built once as the document the API server applies: a JSON Patch whose `test` operations
//! are the guard, followed by the change. [`KubeStore`](super::KubeStore) sends these documents as they are;
//! [`MemoryStore`](super::MemoryStore) applies the very same documents to its objects with [`apply`], so the
//! fault-injecting simulation proves the guards that reach the server, not a copy of them (docs/design.md,
//! "The store protocol").
//!
//! A `test` of `null` is read as the API server reads it (its JSON Patch implementation, evanphx/json-patch):
//! it passes while the key is absent from an object that exists, so "add this entry only if the offset is free"
//! is one `test` and one `add`. RFC 6902 would refuse it; [`apply`] follows the server.
//!
//! The merge patches at the end are not guards (they only ever add a key the caller owns), but they too are built
//! here once, for both stores.

use json_patch::{
    AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation, jsonptr::PointerBuf,
};
use serde_json::{Value, json};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{AsRead, Claim, ReleaseRecord};
use crate::crd::{IpAllocation, NodeSliceAllocation, OverlappingRangeIpReservation, SubInterfaceRecord};

/// Which guarded write a patch is: what a mutation test names when it takes one `test` away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Guard {
    /// An entry added at a free offset, whose release record and sub-interface record are still as read.
    AddEntry,
    /// An entry replaced while it still holds the expected attachment.
    ReplaceEntry,
    /// An entry removed while it still holds the expected attachment (and release records pruned as read).
    RemoveEntry,
    /// A reservation rewritten while it is still at the version read.
    TakeOver,
    /// A NodeSlicePool slice given to a node while it is still as read.
    MoveSlice,
    /// A sub-interface record removed while it still names the node.
    RemoveSubInterface,
    /// A release record ahead of the clock rewritten while it still has the time read.
    RetimeRelease,
    /// A NodeSlicePool's owner references rewritten while the object is still at the version read.
    KeepOwners,
    /// An IPAMClaim's status written while the claim is still at the version read.
    ClaimStatus,
}

impl Guard {
    /// Every guarded write.
    pub const ALL: [Guard; 9] = [
        Guard::AddEntry,
        Guard::ReplaceEntry,
        Guard::RemoveEntry,
        Guard::TakeOver,
        Guard::MoveSlice,
        Guard::RemoveSubInterface,
        Guard::RetimeRelease,
        Guard::KeepOwners,
        Guard::ClaimStatus,
    ];
}

fn pointer(path: &str) -> PointerBuf {
    PointerBuf::parse(path).unwrap_or_else(|e| panic!("{path:?} is built here from offsets and names: {e}"))
}

fn test(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Test(TestOperation { path: pointer(path), value })
}

fn add(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path: pointer(path), value })
}

fn replace(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation { path: pointer(path), value })
}

fn remove(path: &str) -> PatchOperation {
    PatchOperation::Remove(RemoveOperation { path: pointer(path) })
}

fn value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("the CRD types serialise")
}

fn entry_path(offset: u128) -> String {
    format!("/spec/allocations/{offset}")
}

/// Tests that the entry at `path` is still `held`'s: container, pod, and interface when `held` records one.
fn entry_tests(path: &str, held: &IpAllocation) -> Vec<PatchOperation> {
    let mut ops =
        vec![test(&format!("{path}/id"), json!(held.id)), test(&format!("{path}/podref"), json!(held.podref))];
    if !held.ifname.is_empty() {
        ops.push(test(&format!("{path}/ifname"), json!(held.ifname)));
    }
    ops
}

/// The patch of `guard` made of `ops` (less one `test`, under a mutation test).
fn guarded(guard: Guard, ops: Vec<PatchOperation>) -> Patch {
    Patch(mutants::apply(guard, ops))
}

/// Adds `entry` at `offset` if, and only if, no entry is there — of two writers of one offset exactly one wins —
/// and what else the claim decided on is still as read: in a pool with a reuse cooldown, the offset's release
/// record (a release since the read makes the address cool again); in IaaS provider mode, the node and VLAN of
/// its sub-interface record (a provider that marked it unbinding or moved it since makes the claim fail); in slice
/// mode, an entry that showed the pool in use.
pub fn add_entry(offset: u128, entry: &IpAllocation, read: &AsRead) -> Patch {
    let path = entry_path(offset);
    let mut ops = vec![test(&path, Value::Null)];
    if let Some(released) = &read.released {
        ops.push(test(&format!("/spec/released/{offset}"), json!(released)));
    }
    if let Some(seen) = &read.sub_interface {
        let record = format!("/spec/subInterfaces/{offset}");
        ops.push(test(&format!("{record}/node"), json!(seen.node)));
        ops.push(test(&format!("{record}/vlan"), json!(seen.vlan)));
    }
    if let Some((other, id)) = &read.in_use {
        ops.push(test(&format!("{}/id", entry_path(*other)), json!(id)));
    }
    // a test of null needs the parent: a pool read without annotations is tested for having none still
    match &read.replaced {
        None => {}
        Some(super::MarkAsRead::NoAnnotations) => ops.push(test("/metadata/annotations", Value::Null)),
        Some(super::MarkAsRead::Unmarked) => ops.push(test(&replaced_path(), Value::Null)),
        Some(super::MarkAsRead::Marked(mark)) => ops.push(test(&replaced_path(), json!(mark))),
    }
    // and its layout settled: a claim planned on a copy from before the pool went and was made again lands in no
    // pool whose replaced pools are still to be decided
    if matches!(read.replaced, Some(super::MarkAsRead::Unmarked | super::MarkAsRead::Marked(_))) {
        ops.push(test(&annotation_path(super::PENDING_ANNOTATION), Value::Null));
    }
    ops.push(add(&path, value(entry)));
    guarded(Guard::AddEntry, ops)
}

fn replaced_path() -> String {
    annotation_path(super::REPLACED_ANNOTATION)
}

/// The JSON Pointer of the annotation `key` (its `/` escaped).
fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", key.replace('/', "~1"))
}

/// Marks a pool replaced at `at` ([`super::REPLACED_ANNOTATION`]) if it still has no mark: of two claims marking
/// one pool, the first mark stays. `annotated`: whether the pool as read had annotations (a test of null needs the
/// parent). Not under [`Guard`]'s mutation test: an unguarded mark only moves the window later.
pub fn mark_replaced(annotated: bool, at: &str) -> Patch {
    if annotated {
        Patch(vec![test(&replaced_path(), Value::Null), add(&replaced_path(), json!(at))])
    } else {
        let annotations = json!({super::REPLACED_ANNOTATION: at});
        Patch(vec![test("/metadata/annotations", Value::Null), add("/metadata/annotations", annotations)])
    }
}

/// Decides what a pool whose replaced pools were pending replaces ([`super::PENDING_ANNOTATION`]), if the pool is
/// still at `version` (as read with the list the decision was made on): names `overlaps` and `keeps_off` (what it
/// named before and what the list adds: the lists only grow, so an empty one is left unwritten) and removes the
/// pending mark, whose removal alone already fails once another decision landed; the version test also refuses a
/// decision made on a list older than the pool (made again since, or marked). Not under [`Guard`]'s mutation test,
/// which the ADD and DEL simulation drives and where two pools made at once are rare: proven by `claim::replaces::tests`.
pub fn settle(version: &str, overlaps: &[String], keeps_off: &[String]) -> Patch {
    let mut ops = vec![test("/metadata/resourceVersion", json!(version))];
    for (key, names) in [(super::OVERLAPS_ANNOTATION, overlaps), (super::KEEPS_OFF_ANNOTATION, keeps_off)] {
        if !names.is_empty() {
            ops.push(add(&annotation_path(key), json!(names.join(","))));
        }
    }
    ops.push(remove(&annotation_path(super::PENDING_ANNOTATION)));
    Patch(ops)
}

/// Replaces the entry at `offset` with `entry` if it still holds `expected`'s container, pod and interface.
pub fn replace_entry(offset: u128, expected: &IpAllocation, entry: &IpAllocation) -> Patch {
    let path = entry_path(offset);
    let mut ops = entry_tests(&path, expected);
    ops.push(replace(&path, value(entry)));
    guarded(Guard::ReplaceEntry, ops)
}

/// Removes the entry at `offset` if it still holds `held`'s container, pod and interface; with `record` (a pool
/// with a reuse cooldown), writes the release time and prunes the expired records, each only if it still has the
/// value read. `spec.released` must exist: [`make_released`] makes it first when `record` says it does not.
pub fn remove_entry(offset: u128, held: &IpAllocation, record: Option<&ReleaseRecord>) -> Patch {
    let path = entry_path(offset);
    let mut ops = entry_tests(&path, held);
    ops.push(remove(&path));
    if let Some(record) = record {
        for (key, at) in &record.prune {
            let path = format!("/spec/released/{key}");
            ops.push(test(&path, json!(at)));
            ops.push(remove(&path));
        }
        ops.push(add(&format!("/spec/released/{offset}"), json!(record.at)));
    }
    guarded(Guard::RemoveEntry, ops)
}

/// Rewrites the release record at `offset` from `read` (a time ahead of the writer's clock) to `now`, if it still
/// has that value: a release since then wrote a record of its own, which stays.
pub fn retime_release(offset: u128, read: &str, now: &str) -> Patch {
    let path = format!("/spec/released/{offset}");
    guarded(Guard::RetimeRelease, vec![test(&path, json!(read)), replace(&path, json!(now))])
}

/// Rewrites the reservation `current` (as read) to `claim`, keeping labels and annotations of others: a
/// compare-and-swap of the object as read, since a delete or take-over by anyone else changes its version.
pub fn take_over(current: &OverlappingRangeIpReservation, claim: &Claim) -> Patch {
    let (labels, annotations) = claim_metadata(current, claim);
    let spec = &claim.spec;
    let mut ops = vec![
        test("/metadata/resourceVersion", json!(current.metadata.resource_version)),
        add("/spec/podref", json!(spec.podref)),
        add("/spec/containerid", json!(spec.containerid)),
        add("/spec/ifname", json!(spec.ifname)),
    ];
    match &spec.ipamclaim {
        Some(claim) => ops.push(add("/spec/ipamclaim", json!(claim))),
        None if current.spec.ipamclaim.is_some() => ops.push(remove("/spec/ipamclaim")),
        None => {}
    }
    ops.push(add("/metadata/labels", labels));
    ops.push(add("/metadata/annotations", annotations));
    guarded(Guard::TakeOver, ops)
}

/// Writes `status` on the IPAMClaim `current` if it is still at the version read: of two pods of one claim
/// writing their addresses at once, one wins and the other reads again.
pub fn claim_status(current: &crate::crd::IpamClaim, status: &crate::crd::IpamClaimStatus) -> Patch {
    guarded(
        Guard::ClaimStatus,
        vec![
            test("/metadata/resourceVersion", json!(current.metadata.resource_version)),
            add("/status", json!(status)),
        ],
    )
}

/// The labels and annotations `claim` writes, over those `current` already has.
fn claim_metadata(current: &OverlappingRangeIpReservation, claim: &Claim) -> (Value, Value) {
    let ours = super::reservation_object("", claim).metadata;
    let merge = |theirs: &Option<std::collections::BTreeMap<String, String>>,
                 ours: Option<std::collections::BTreeMap<String, String>>| {
        let mut all = theirs.clone().unwrap_or_default();
        all.extend(ours.unwrap_or_default());
        json!(all)
    };
    (merge(&current.metadata.labels, ours.labels), merge(&current.metadata.annotations, ours.annotations))
}

/// Gives the slice at `index` of a NodeSlicePool to node `to` if it is still `slice` held by `slice.node_name`
/// (`""`: free). Of two nodes claiming one free slice, exactly one succeeds; a slice is freed the same way.
pub fn move_slice(index: usize, slice: &NodeSliceAllocation, to: &str) -> Patch {
    let path = format!("/status/allocations/{index}");
    let mut ops = slice_as_read(&path, slice);
    ops.push(replace(&format!("{path}/nodeName"), json!(to)));
    guarded(Guard::MoveSlice, ops)
}

/// Cuts the slice at `index` of a NodeSlicePool (adaptive slices) if it is still `slice` held by
/// `slice.node_name`: node `to` gets its part `kept` in its place, and the other parts (`rest`) are appended free.
/// The guard is [`move_slice`]'s; the other entries keep their places, so a concurrent claim of another slice,
/// guarded on its own place, is not disturbed.
pub fn split_slice(index: usize, slice: &NodeSliceAllocation, to: &str, kept: &str, rest: &[String]) -> Patch {
    let path = format!("/status/allocations/{index}");
    let mut ops = slice_as_read(&path, slice);
    ops.push(replace(&path, json!(NodeSliceAllocation { node_name: to.to_string(), slice_range: kept.to_string() })));
    ops.extend(rest.iter().map(|r| {
        add("/status/allocations/-", json!(NodeSliceAllocation { node_name: String::new(), slice_range: r.clone() }))
    }));
    guarded(Guard::MoveSlice, ops)
}

/// Joins two free slices of a NodeSlicePool (`a` at `i`, `b` at `j`, buddies) into `parent` if both are still as
/// read: `parent` takes `i`'s place, `j` is removed. The entries after `j` move up one place, so a concurrent claim
/// of one of them, guarded on its place, is refused and reads again: nothing is claimed that was not read.
pub fn join_slices(i: usize, a: &NodeSliceAllocation, j: usize, b: &NodeSliceAllocation, parent: &str) -> Patch {
    let (at_i, at_j) = (format!("/status/allocations/{i}"), format!("/status/allocations/{j}"));
    let mut ops = slice_as_read(&at_i, a);
    ops.extend(slice_as_read(&at_j, b));
    ops.push(replace(&at_i, json!(NodeSliceAllocation { node_name: String::new(), slice_range: parent.to_string() })));
    ops.push(remove(&at_j));
    guarded(Guard::MoveSlice, ops)
}

fn slice_as_read(path: &str, slice: &NodeSliceAllocation) -> Vec<PatchOperation> {
    vec![
        test(&format!("{path}/sliceRange"), json!(slice.slice_range)),
        test(&format!("{path}/nodeName"), json!(slice.node_name)),
    ]
}

/// Sets the owner references of an object to `kept` if it is still at `version`: whatever was added since (by
/// another controller) is not dropped unseen.
pub fn keep_owners(version: &str, kept: &[OwnerReference]) -> Patch {
    guarded(
        Guard::KeepOwners,
        vec![test("/metadata/resourceVersion", json!(version)), add("/metadata/ownerReferences", json!(kept))],
    )
}

/// The annotation a replaced pool keeps of an entry moved out of it, at the offset in its key, naming the entry's
/// container: written in the same patch as the removal, so that a mover whose answer was lost can tell its own
/// removal from the pod's DEL.
pub fn moved_annotation(offset: u128) -> String {
    format!("hereabouts.cni.cncf.io/moved-{offset}")
}

/// Removes the entry at `offset` if it is still `held`'s, leaving [`moved_annotation`] in its place (`annotated`:
/// the pool as read has annotations to add it to). Not under [`Guard`]'s mutation test, which the ADD and DEL
/// simulation drives: the leader's re-layout is proven by its own tests (`reconcile::relayout`).
pub fn move_out(offset: u128, held: &IpAllocation, annotated: bool) -> Patch {
    let path = entry_path(offset);
    let mut ops = entry_tests(&path, held);
    ops.push(remove(&path));
    let key = moved_annotation(offset);
    if annotated {
        ops.push(add(&annotation_path(&key), json!(held.id)));
    } else {
        ops.push(add("/metadata/annotations", json!({ key: held.id })));
    }
    Patch(ops)
}

/// Narrows a pool's list of the pools it replaces ([`super::OVERLAPS_ANNOTATION`]) from `named`, if it still
/// reads so, to `kept` (removing it when none is kept). Not under [`Guard`]'s mutation test, which the ADD and
/// DEL simulation drives: the leader's retirement is proven by its own test (`reconcile::retire`).
pub fn narrow_overlaps(named: &[String], kept: &[String]) -> Patch {
    let path = annotation_path(super::OVERLAPS_ANNOTATION);
    let change = if kept.is_empty() { remove(&path) } else { replace(&path, json!(kept.join(","))) };
    Patch(vec![test(&path, json!(named.join(","))), change])
}

/// Removes the sub-interface record at `offset` if it still names `node`.
pub fn remove_sub_interface(offset: u128, node: &str) -> Patch {
    let path = format!("/spec/subInterfaces/{offset}");
    guarded(Guard::RemoveSubInterface, vec![test(&format!("{path}/node"), json!(node)), remove(&path)])
}

/// The merge patch that records the sub-interface of `offset`: it makes the map when the pool has none, and
/// touches no other key of it (the caller holds the entry; the provider writes back only idle ones).
pub fn record_sub_interface(offset: u128, record: &SubInterfaceRecord) -> Value {
    json!({"spec": {"subInterfaces": {offset.to_string(): record}}})
}

/// The merge patch that sets a pool's reuse cooldown (`0` removes it) and, with one, makes `spec.released`.
pub fn set_cooldown(seconds: u64) -> Value {
    let key = crate::cooldown::COOLDOWN_ANNOTATION;
    match seconds {
        0 => json!({"metadata": {"annotations": {key: null}}}),
        n => json!({"metadata": {"annotations": {key: n.to_string()}}, "spec": {"released": {}}}),
    }
}

/// The merge patch that writes a pool's entry count and capacity where `kubectl get ippools` shows them. Not a
/// guard: the leader alone writes them, and a count a moment old is what a table of pools shows anyway.
pub fn counted(allocated: usize, usable: u128) -> Value {
    json!({"metadata": {"annotations": {
        super::ALLOCATED_ANNOTATION: allocated.to_string(),
        super::USABLE_ANNOTATION: usable.to_string(),
    }}})
}

/// The merge patch that makes `spec.released` when it is missing, and changes nothing else: a JSON Patch cannot
/// add below a missing map.
pub fn make_released() -> Value {
    json!({"spec": {"released": {}}})
}

/// Why [`apply`] refused a patch: what the API server answers with 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the patch was refused: operation {index} ({op}) failed: {reason}")]
pub struct Refusal {
    /// The operation's place in the patch.
    pub index: usize,
    /// `test`, `add`, ...
    pub op: &'static str,
    /// What failed.
    pub reason: String,
}

/// Applies `patch` to `doc` as the API server does, all or nothing: `doc` is left as it was on a refusal.
pub fn apply(doc: &mut Value, patch: &Patch) -> Result<(), Refusal> {
    let mut work = doc.clone();
    for (index, op) in patch.0.iter().enumerate() {
        let refused = |reason: String| Refusal { index, op: op_name(op), reason };
        if let PatchOperation::Test(t) = op
            && t.value.is_null()
        {
            if !absent_or_null(&work, t.path.as_str()).map_err(refused)? {
                return Err(refused(format!("{} is not null", t.path)));
            }
            continue;
        }
        json_patch::patch(&mut work, std::slice::from_ref(op)).map_err(|e| refused(e.to_string()))?;
    }
    *doc = work;
    Ok(())
}

/// The API server's `test` of `null`: true when the value at `path` is null or the key is missing from an object
/// that exists; an error when even its parent is missing.
fn absent_or_null(doc: &Value, path: &str) -> Result<bool, String> {
    if let Some(v) = doc.pointer(path) {
        return Ok(v.is_null());
    }
    let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
    match doc.pointer(parent) {
        Some(Value::Object(_)) => Ok(true),
        _ => Err(format!("{path}: its parent does not exist")),
    }
}

fn op_name(op: &PatchOperation) -> &'static str {
    match op {
        PatchOperation::Add(_) => "add",
        PatchOperation::Remove(_) => "remove",
        PatchOperation::Replace(_) => "replace",
        PatchOperation::Move(_) => "move",
        PatchOperation::Copy(_) => "copy",
        PatchOperation::Test(_) => "test",
    }
}

/// Whether the entry at `offset` of `pool` (as read) still holds `held`'s attachment: whether the guard of its
/// removal would pass now. A releaser whose guarded removal was refused reads the pool back and asks this, so the
/// read-back judges by the guard itself.
pub fn still_holds(pool: &crate::crd::IpPool, offset: u128, held: &IpAllocation) -> bool {
    let mut doc = value(pool);
    apply(&mut doc, &Patch(entry_tests(&entry_path(offset), held))).is_ok()
}

/// Applies the merge patch `patch` to `doc` (RFC 7386, as the API server applies a merge patch to a custom
/// resource).
pub fn merge(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// A mutation test's switch: with the `guard-mutants` feature, one `test` operation of one guard can be taken away
/// for the current thread, and the simulation must then find a counterexample (ipam/tests/simulation.rs).
#[cfg(feature = "guard-mutants")]
pub mod mutants {
    use std::cell::Cell;

    use json_patch::PatchOperation;

    use super::Guard;

    thread_local! {
        static DROPPED: Cell<Option<(Guard, usize)>> = const { Cell::new(None) };
    }

    /// From now on, on this thread, patches of `guard` lose their `nth` `test` operation (from 0); `None` undoes it.
    pub fn drop_test(mutant: Option<(Guard, usize)>) {
        DROPPED.with(|d| d.set(mutant));
    }

    /// How many `test` operations the patch of `guard` built for a typical write has (see the simulation).
    pub(super) fn apply(guard: Guard, mut ops: Vec<PatchOperation>) -> Vec<PatchOperation> {
        if let Some((g, nth)) = DROPPED.with(Cell::get)
            && g == guard
            && let Some(at) = ops.iter().enumerate().filter(|(_, op)| matches!(op, PatchOperation::Test(_))).nth(nth)
        {
            ops.remove(at.0);
        }
        ops
    }
}

#[cfg(not(feature = "guard-mutants"))]
mod mutants {
    use json_patch::PatchOperation;

    use super::Guard;

    pub(super) fn apply(_: Guard, ops: Vec<PatchOperation>) -> Vec<PatchOperation> {
        ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Value {
        json!({"metadata": {"resourceVersion": "7"}, "spec": {"range": "198.18.0.0/30", "allocations": {
            "1": {"id": "c1", "podref": "ns/a", "ifname": "net1"}}}})
    }

    fn entry(id: &str, podref: &str) -> IpAllocation {
        IpAllocation { id: id.into(), podref: podref.into(), ifname: "net1".into(), ..IpAllocation::default() }
    }

    /// A take-over by a pod of no IPAMClaim, of a reservation that named one, drops the name (kept, the address
    /// would read as the claim's and outlive the pod that holds it now); one by a claim's pod records its claim; the
    /// version read is tested. (cargo-mutants' first run left the first arm untested.)
    #[test]
    fn a_take_over_records_the_new_holders_claim_or_none() {
        use crate::crd::{OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec};
        let spec = |container: &str, podref: &str, claim: Option<&str>| OverlappingRangeIpReservationSpec {
            containerid: container.into(),
            podref: podref.into(),
            ifname: "net1".into(),
            ipamclaim: claim.map(str::to_string),
        };
        let claim = |spec| Claim { spec, node: "node-a".into(), at: k8s_openapi::jiff::Timestamp::now() };
        let mut current = OverlappingRangeIpReservation::new("198.18.0.1", spec("old", "ns/vm-0", Some("ns/vm")));
        current.metadata.resource_version = Some("7".into());
        current.metadata.labels = Some([("team".to_string(), "blue".to_string())].into());
        let taken = |current: &OverlappingRangeIpReservation, by: &Claim| {
            let mut doc = serde_json::to_value(current).unwrap();
            apply(&mut doc, &take_over(current, by))
                .map(|()| serde_json::from_value::<OverlappingRangeIpReservation>(doc).unwrap())
        };
        let after = taken(&current, &claim(spec("new", "ns/b", None))).unwrap();
        assert_eq!((after.spec.podref.as_str(), after.spec.ipamclaim.as_deref()), ("ns/b", None), "{after:?}");
        // the new holder's node and claim time written, another's label kept
        let labels = after.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            (labels.get(super::super::NODE_LABEL), labels.get("team")),
            (Some(&"node-a".into()), Some(&"blue".into()))
        );
        let annotations = after.metadata.annotations.clone().unwrap_or_default();
        assert!(annotations.contains_key(super::super::CLAIMED_ANNOTATION), "{after:?}");
        let after = taken(&current, &claim(spec("new", "ns/vm-1", Some("ns/vm")))).unwrap();
        assert_eq!(after.spec.ipamclaim.as_deref(), Some("ns/vm"), "{after:?}");
        let mut moved_on = serde_json::to_value(&current).unwrap();
        moved_on["metadata"]["resourceVersion"] = json!("8");
        let refused = apply(&mut moved_on, &take_over(&current, &claim(spec("new", "ns/b", None))));
        assert!(refused.is_err(), "a take-over planned on version 7 is refused at 8");
    }

    #[test]
    fn a_free_offset_is_added_once() {
        let mut doc = pool();
        apply(&mut doc, &add_entry(2, &entry("c2", "ns/b"), &AsRead::default())).unwrap();
        assert_eq!(doc["spec"]["allocations"]["2"]["podref"], "ns/b");
        let before = doc.clone();
        let refused = apply(&mut doc, &add_entry(2, &entry("c3", "ns/c"), &AsRead::default())).unwrap_err();
        assert_eq!(refused.op, "test");
        assert_eq!(doc, before, "nothing of a refused patch is applied");
    }

    #[test]
    fn a_test_of_null_needs_the_parent() {
        let mut doc = json!({"spec": {}});
        assert!(
            apply(&mut doc, &add_entry(2, &entry("c2", "ns/b"), &AsRead::default())).is_err(),
            "no allocations map"
        );
    }

    #[test]
    fn removal_and_replacement_test_the_holder() {
        let mut doc = pool();
        assert!(apply(&mut doc, &remove_entry(1, &entry("other", "ns/a"), None)).is_err());
        assert!(apply(&mut doc, &replace_entry(1, &entry("c1", "ns/x"), &entry("c9", "ns/a"))).is_err());
        apply(&mut doc, &replace_entry(1, &entry("c1", "ns/a"), &entry("c9", "ns/a"))).unwrap();
        apply(&mut doc, &remove_entry(1, &entry("c9", "ns/a"), None)).unwrap();
        assert_eq!(doc["spec"]["allocations"], json!({}));
    }

    /// A settle names what it decided, drops the pending mark, and is refused on a pool changed since its list.
    #[test]
    fn a_settle_names_what_it_replaces_and_ends_pending_at_the_version_listed() {
        use super::super::{KEEPS_OFF_ANNOTATION, OVERLAPS_ANNOTATION, PENDING_ANNOTATION};
        let pending = json!({"metadata": {"resourceVersion": "7", "annotations": {PENDING_ANNOTATION: "true"}}});
        let mut doc = pending.clone();
        apply(&mut doc, &settle("7", &["a".into(), "b".into()], &[])).unwrap();
        assert_eq!(doc["metadata"]["annotations"], json!({OVERLAPS_ANNOTATION: "a,b"}));
        let mut doc = pending.clone();
        apply(&mut doc, &settle("7", &[], &["c".into()])).unwrap();
        assert_eq!(doc["metadata"]["annotations"], json!({KEEPS_OFF_ANNOTATION: "c"}));
        assert!(apply(&mut pending.clone(), &settle("6", &["a".into()], &[])).is_err(), "listed before a change");
        assert!(apply(&mut doc, &settle("7", &["a".into()], &[])).is_err(), "settled already");
    }

    /// A pool's sub-interface records: one written by a merge that keeps the others, one removed only while it
    /// names the node that removes it; the leader's counts written beside the pool's other annotations.
    #[test]
    fn sub_interface_records_and_counts_touch_only_their_own_keys() {
        let mut doc = json!({"metadata": {"annotations": {"team": "blue"}}, "spec": {"range": "198.18.0.0/30",
            "subInterfaces": {"2": {"node": "node-b", "vlan": 12}}}});
        let record = SubInterfaceRecord { node: "node-a".into(), vlan: 11, ..Default::default() };
        merge(&mut doc, &record_sub_interface(1, &record));
        assert_eq!(doc["spec"]["subInterfaces"]["1"]["node"], json!("node-a"));
        assert_eq!(doc["spec"]["subInterfaces"]["2"]["node"], json!("node-b"));
        assert_eq!(doc["spec"]["range"], json!("198.18.0.0/30"));
        assert!(apply(&mut doc, &remove_sub_interface(2, "node-a")).is_err(), "node-b's record");
        apply(&mut doc, &remove_sub_interface(1, "node-a")).unwrap();
        assert_eq!(doc["spec"]["subInterfaces"], json!({"2": {"node": "node-b", "vlan": 12}}));
        merge(&mut doc, &counted(3, 14));
        let annotations = &doc["metadata"]["annotations"];
        assert_eq!(annotations[super::super::ALLOCATED_ANNOTATION], json!("3"));
        assert_eq!(annotations[super::super::USABLE_ANNOTATION], json!("14"));
        assert_eq!(annotations["team"], json!("blue"));
    }

    /// One container's two interfaces on one network hold two entries: each is its interface's. An entry written
    /// without an interface (by Whereabouts) is judged by container and pod alone.
    #[test]
    fn a_removal_tests_the_interface_when_the_entry_names_one() {
        let mut doc = pool();
        let other_interface = IpAllocation { ifname: "net2".into(), ..entry("c1", "ns/a") };
        assert!(apply(&mut doc, &remove_entry(1, &other_interface, None)).is_err());
        let mut doc = json!({"spec": {"allocations": {"1": {"id": "c1", "podref": "ns/a"}}}});
        apply(&mut doc, &remove_entry(1, &IpAllocation { ifname: String::new(), ..entry("c1", "ns/a") }, None))
            .unwrap();
        assert_eq!(doc["spec"]["allocations"], json!({}));
    }

    #[test]
    fn an_add_fails_once_the_address_was_released_since_it_was_read() {
        let mut doc = pool();
        merge(&mut doc, &make_released());
        let unreleased = AsRead { released: Some(None), ..AsRead::default() };
        let mut released = doc.clone();
        released["spec"]["released"]["2"] = json!("2026-01-02T00:00:00Z");
        assert!(apply(&mut released, &add_entry(2, &entry("c2", "ns/b"), &unreleased)).is_err(), "released since");
        apply(&mut doc, &add_entry(2, &entry("c2", "ns/b"), &unreleased)).unwrap();
        let as_read = AsRead { released: Some(Some("2026-01-02T00:00:00Z".into())), ..AsRead::default() };
        apply(&mut released, &add_entry(3, &entry("c3", "ns/c"), &AsRead { released: Some(None), ..as_read.clone() }))
            .unwrap();
        assert!(apply(&mut released.clone(), &add_entry(2, &entry("c2", "ns/b"), &as_read)).is_ok(), "as read");
    }

    #[test]
    fn an_add_planned_on_a_pool_in_use_fails_once_the_entry_it_saw_is_gone() {
        let in_use = AsRead { in_use: Some((1, "c1".into())), ..AsRead::default() };
        let mut doc = pool();
        apply(&mut doc.clone(), &add_entry(2, &entry("c2", "ns/b"), &in_use)).unwrap();
        apply(&mut doc, &remove_entry(1, &entry("c1", "ns/a"), None)).unwrap();
        let before = doc.clone();
        assert!(apply(&mut doc, &add_entry(2, &entry("c2", "ns/b"), &in_use)).is_err(), "emptied since");
        assert_eq!(doc, before);
        let mut other = pool();
        other["spec"]["allocations"]["1"]["id"] = json!("c7");
        assert!(apply(&mut other, &add_entry(2, &entry("c2", "ns/b"), &in_use)).is_err(), "another entry there now");
    }

    #[test]
    fn a_release_record_prunes_only_what_it_read() {
        let mut doc = pool();
        merge(&mut doc, &make_released());
        doc["spec"]["released"]["2"] = json!("2026-01-01T00:00:00Z");
        let record = ReleaseRecord {
            at: "2026-01-02T00:00:00Z".into(),
            prune: vec![("2".into(), "2025-12-31T00:00:00Z".into())],
            map_exists: true,
        };
        assert!(apply(&mut doc, &remove_entry(1, &entry("c1", "ns/a"), Some(&record))).is_err(), "renewed since");
        let record = ReleaseRecord { prune: vec![("2".into(), "2026-01-01T00:00:00Z".into())], ..record };
        apply(&mut doc, &remove_entry(1, &entry("c1", "ns/a"), Some(&record))).unwrap();
        assert_eq!(doc["spec"]["released"], json!({"1": "2026-01-02T00:00:00Z"}));
    }

    #[test]
    fn a_slice_moves_only_from_the_owner_read() {
        let mut doc = json!({"status": {"allocations": [{"nodeName": "", "sliceRange": "198.18.0.0/30"}]}});
        let free = NodeSliceAllocation { node_name: String::new(), slice_range: "198.18.0.0/30".into() };
        apply(&mut doc, &move_slice(0, &free, "node-a")).unwrap();
        assert!(apply(&mut doc, &move_slice(0, &free, "node-b")).is_err(), "node-a has it now");
        assert_eq!(doc["status"]["allocations"][0]["nodeName"], "node-a");
    }
}
