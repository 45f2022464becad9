//! The git smart-HTTP proxy at `/api/git`: authenticates a project token, forwards to the
//! token owner's upstream repository with the service credentials, and reports external pushes.

pub mod pkt_line;
pub mod report_status;
