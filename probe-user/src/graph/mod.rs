//! The wait-for graph: open waits from every source, edges from waiter to
//! holder, and the incidents built from them each scan.
//!
//! Data flows one way: sources describe their open waits in [`model`]'s
//! terms and hand over their facts; [`scan`] runs one step: the resolvers
//! ([`resolvers`], [`requests`], [`devices`], [`children`], [`parked`]) add
//! edges, [`incidents`] turns the graph into raised, escalated and resolved
//! incidents. Nothing here prints or reads `/proc`: lookups go through the
//! traits the `observe` layer implements ([`resolvers::Procs`],
//! [`children::ChildProcs`], [`scan::Lookups`]), and the scheduler hands the
//! changes to the sinks.

pub mod children;
pub mod devices;
#[cfg(test)]
pub(crate) mod fakes;
pub mod ids;
pub mod incidents;
pub mod model;
pub mod parked;
pub mod requests;
pub mod resolvers;
pub mod scan;
pub mod ttrpc;
