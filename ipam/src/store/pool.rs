use std::collections::BTreeMap;

use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Store, StoreError};
use crate::crd::{IpAllocation, IpPool, IpPoolSpec};

const KIND: &str = "pool";

/// What a guarded add of one allocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    /// The key was absent and now holds the allocation.
    Added,
    /// The key was already present (someone else took the offset): nothing was written.
    Taken,
}

/// What a guarded removal of one allocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// The entry was the expected one and is gone.
    Removed,
    /// The entry was absent or belongs to another container now: nothing was written.
    NotOurs,
}

fn entry_path(offset: u128) -> String {
    format!("/spec/allocations/{offset}")
}

/// A JSON patch that fails (422) unless every `test` holds, applied by the server to the latest object.
fn json_patch(ops: serde_json::Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).expect("a JSON patch built from literals is valid"))
}

/// The server refuses a JSON patch whose `test` fails with 422 Unprocessable Entity (shown by the protocol
/// tests); no other cause of 422 is possible for these fixed-shape patches on a pool that exists.
fn is_failed_test(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 422)
}

impl Store {
    /// Reads the pool `name`, or `None` when it does not exist.
    pub async fn get_pool(&self, name: &str) -> Result<Option<IpPool>, StoreError> {
        self.pools.get_opt(name).await.map_err(|e| StoreError::new(KIND, name, "get", e))
    }

    /// Reads the pool `name`, creating it empty for `range` when it does not exist. A create that finds the pool
    /// already there (another writer just made it) reads it again.
    pub async fn get_or_create_pool(&self, name: &str, range: &str) -> Result<IpPool, StoreError> {
        if let Some(pool) = self.get_pool(name).await? {
            return Ok(pool);
        }
        let pool = IpPool::new(name, IpPoolSpec { range: range.to_string(), allocations: BTreeMap::new() });
        match self.pools.create(&PostParams::default(), &pool).await {
            Ok(created) => Ok(created),
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                self.pools.get(name).await.map_err(|e| StoreError::new(KIND, name, "get after create", e))
            }
            Err(e) => Err(StoreError::new(KIND, name, "create", e)),
        }
    }

    /// Lists every pool of the namespace.
    pub async fn list_pools(&self) -> Result<Vec<IpPool>, StoreError> {
        let list = self.pools.list(&Default::default()).await.map_err(|e| StoreError::new(KIND, "*", "list", e))?;
        Ok(list.items)
    }

    /// One cheap read that shows the server is reachable and lets us read pools here (CNI STATUS).
    pub async fn probe(&self) -> Result<(), StoreError> {
        let params = kube::api::ListParams::default().limit(1);
        self.pools.list_metadata(&params).await.map(drop).map_err(|e| StoreError::new(KIND, "*", "list", e))
    }

    /// Adds `allocation` at `offset` if, and only if, no entry is there: writers of different offsets never
    /// conflict, and of two writers of one offset exactly one succeeds.
    pub async fn add_allocation(
        &self,
        pool: &str,
        offset: u128,
        allocation: &IpAllocation,
    ) -> Result<AddOutcome, StoreError> {
        let path = entry_path(offset);
        let patch = json_patch(json!([
            {"op": "test", "path": path, "value": null},
            {"op": "add", "path": path, "value": allocation},
        ]));
        match self.pools.patch(pool, &PatchParams::default(), &patch).await {
            Ok(_) => Ok(AddOutcome::Added),
            Err(e) if is_failed_test(&e) => Ok(AddOutcome::Taken),
            Err(e) => Err(StoreError::new(KIND, pool, format!("add allocation {offset}"), e)),
        }
    }

    /// Replaces the entry at `offset` with `allocation` if it still is `expected` (a retried ADD of the same pod
    /// and interface from a new container).
    pub async fn replace_allocation(
        &self,
        pool: &str,
        offset: u128,
        expected: &IpAllocation,
        allocation: &IpAllocation,
    ) -> Result<bool, StoreError> {
        let path = entry_path(offset);
        let patch = json_patch(json!([
            {"op": "test", "path": format!("{path}/id"), "value": expected.id},
            {"op": "test", "path": format!("{path}/podref"), "value": expected.podref},
            {"op": "replace", "path": path, "value": allocation},
        ]));
        match self.pools.patch(pool, &PatchParams::default(), &patch).await {
            Ok(_) => Ok(true),
            Err(e) if is_failed_test(&e) => Ok(false),
            Err(e) => Err(StoreError::new(KIND, pool, format!("replace allocation {offset}"), e)),
        }
    }

    /// Removes the entry at `offset` if it still belongs to container `id` (and interface `ifname`, when the entry
    /// records one), so a release can never free an address that was re-assigned in between.
    pub async fn remove_allocation(
        &self,
        pool: &str,
        offset: u128,
        held: &IpAllocation,
    ) -> Result<RemoveOutcome, StoreError> {
        let path = entry_path(offset);
        let mut ops = vec![
            json!({"op": "test", "path": format!("{path}/id"), "value": held.id}),
            json!({"op": "test", "path": format!("{path}/podref"), "value": held.podref}),
        ];
        if !held.ifname.is_empty() {
            ops.push(json!({"op": "test", "path": format!("{path}/ifname"), "value": held.ifname}));
        }
        ops.push(json!({"op": "remove", "path": path}));
        match self.pools.patch(pool, &PatchParams::default(), &json_patch(ops.into())).await {
            Ok(_) => Ok(RemoveOutcome::Removed),
            Err(e) if is_failed_test(&e) => Ok(RemoveOutcome::NotOurs),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(RemoveOutcome::NotOurs),
            Err(e) => Err(StoreError::new(KIND, pool, format!("remove allocation {offset}"), e)),
        }
    }
}
