use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

use super::{Store, StoreError};
use crate::crd::{OverlappingRangeIpReservation, OverlappingRangeIpReservationSpec};

const KIND: &str = "reservation";

/// What creating a reservation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// The reservation is new: this invocation holds the address cluster-wide.
    Created,
    /// A reservation of the address already exists, as held by this spec.
    Exists(OverlappingRangeIpReservationSpec),
}

impl Store {
    /// Creates the reservation `name` (the cluster-wide claim on one address). When one exists, reports who holds
    /// it.
    pub async fn reserve(
        &self,
        name: &str,
        spec: &OverlappingRangeIpReservationSpec,
    ) -> Result<ReserveOutcome, StoreError> {
        let reservation = OverlappingRangeIpReservation::new(name, spec.clone());
        match self.reservations.create(&PostParams::default(), &reservation).await {
            Ok(_) => Ok(ReserveOutcome::Created),
            Err(kube::Error::Api(status)) if status.is_already_exists() => match self.get_reservation(name).await? {
                Some(existing) => Ok(ReserveOutcome::Exists(existing.spec)),
                // deleted in between: the caller tries the address again
                None => Ok(ReserveOutcome::Exists(OverlappingRangeIpReservationSpec::default())),
            },
            Err(e) => Err(StoreError::new(KIND, name, "create", e)),
        }
    }

    /// Moves the reservation `name` from container `old` to `new` if `podref` still holds it through `old` (a
    /// repeated ADD of the same attachment from a new sandbox). Returns whether it was moved.
    pub async fn move_reservation(&self, name: &str, podref: &str, old: &str, new: &str) -> Result<bool, StoreError> {
        let patch: Patch<()> = Patch::Json(
            serde_json::from_value(json!([
                {"op": "test", "path": "/spec/podref", "value": podref},
                {"op": "test", "path": "/spec/containerid", "value": old},
                {"op": "replace", "path": "/spec/containerid", "value": new},
            ]))
            .expect("a JSON patch built from literals is valid"),
        );
        match self.reservations.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 422 || status.is_not_found() => Ok(false),
            Err(e) => Err(StoreError::new(KIND, name, "move to a new container", e)),
        }
    }

    /// Reads the reservation `name`, or `None` when it does not exist.
    pub async fn get_reservation(&self, name: &str) -> Result<Option<OverlappingRangeIpReservation>, StoreError> {
        self.reservations.get_opt(name).await.map_err(|e| StoreError::new(KIND, name, "get", e))
    }

    /// Lists every reservation of the namespace.
    pub async fn list_reservations(&self) -> Result<Vec<OverlappingRangeIpReservation>, StoreError> {
        let list =
            self.reservations.list(&Default::default()).await.map_err(|e| StoreError::new(KIND, "*", "list", e))?;
        Ok(list.items)
    }

    /// Deletes the reservation `name` if it is still held by `podref` (and container `containerid`, when both
    /// record one). Returns whether it was deleted; a reservation that is gone or held by another pod is left.
    pub async fn release_reservation(&self, name: &str, podref: &str, containerid: &str) -> Result<bool, StoreError> {
        let Some(existing) = self.get_reservation(name).await? else { return Ok(false) };
        let spec = &existing.spec;
        let same_container = spec.containerid.is_empty() || containerid.is_empty() || spec.containerid == containerid;
        if spec.podref != podref || !same_container {
            return Ok(false);
        }
        // The precondition makes the check above and the delete one atomic step.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: existing.metadata.resource_version.clone(),
                uid: existing.metadata.uid.clone(),
            }),
            ..Default::default()
        };
        match self.reservations.delete(name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => Ok(false),
            Err(e) => Err(StoreError::new(KIND, name, "delete", e)),
        }
    }
}
