//! The Charon API's wire (`proto/charon/v1/charon.proto`): the generated
//! code ([`v1`]: the `Charon` service's server trait and client, and its
//! messages), and the conversions between its messages and the service's
//! domain types (`convert`), in one place for the gRPC face and the
//! embedded client alike.

#[cfg(feature = "embedded")]
mod convert;

#[cfg(feature = "embedded")]
pub use convert::{answer_to_wire, capacity_response, error_code, operation_from_wire};

/// The metadata key a unary call's status names its error kind with
/// (`UNKNOWN_RESERVATION`…), where one gRPC code stands for several.
pub const ERROR_KIND_HEADER: &str = "charon-error-kind";

pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("charon.v1");

    /// The encoded descriptors of `charon.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("charon_v1_descriptor");
}
