//! Nothing left behind: the watchdog that removes a batch's container when its cibox
//! dies ([`watchdog`]), and the sweep that removes what dead runs left ([`sweep`]).

pub mod sweep;
pub mod watchdog;
