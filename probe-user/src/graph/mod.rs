//! The wait-for graph: open waits from every source, edges from waiter to
//! holder, and the incidents built from them each scan.
//!
//! Data flows one way: sources describe their open waits in [`model`]'s
//! terms, [`resolvers`] add edges, [`incidents`] turns the graph into
//! raised, escalated and resolved incidents. Nothing here prints: the
//! collector hands the results to the sinks.

pub mod children;
#[cfg(test)]
pub(crate) mod fakes;
pub mod ids;
pub mod incidents;
pub mod model;
pub mod parked;
pub mod resolvers;
pub mod ttrpc;
