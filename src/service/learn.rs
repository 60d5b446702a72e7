//! A limit proposed from recorded use (docs/design.md#learning-a-limit):
//! the running configuration says whether and how a namespace learns, the
//! store holds what was recorded, [`crate::config::learned`] turns it into
//! a namespace file.

use crate::config::learned::{self, Pick};

use super::Service;
use super::error::{Error, Kind};

impl Service {
    /// A namespace file setting each recorded domain's `pick` of use per
    /// window as its limit, for every resource of `namespace` recorded in
    /// the period; with the store's record, so on Redis the whole fleet's.
    pub async fn proposal(&self, namespace: &str, pick: Pick) -> Result<String, Error> {
        let config = self.config();
        let Some(found) = config.namespace(namespace) else {
            return Err(Error::new(
                Kind::UnknownResource,
                format!("namespace `{namespace}` is not configured"),
            ));
        };
        let Some(learn) = found.settings.learn else {
            return Err(Error::new(
                Kind::WrongKind,
                format!(
                    "namespace `{namespace}` records no use: set `settings.learn` (docs/configuration.md#learning-a-limit)"
                ),
            ));
        };
        let (recorded, now) = self
            .learn
            .recorded(namespace, &learn)
            .await
            .map_err(|error| Error::new(Kind::StoreUnavailable, error.to_string()))?;
        Ok(learned::snippet(namespace, &learn, &recorded, pick, now))
    }
}

#[cfg(test)]
mod tests;
