//! Event counters: the crates above count what happened in plain structs
//! of `u64`s and sum them over QPs, lanes and threads. [`counters!`](crate::counters!)
//! declares such a struct together with its field-by-field sum, so a field
//! added later cannot be left out of the sum.
//!
//! ```
//! burst_wire::counters! {
//!     /// What a port saw.
//!     #[derive(Debug, Default)]
//!     pub struct Seen {
//!         /// Frames in.
//!         pub frames: u64,
//!         /// Frames dropped.
//!         pub dropped: u64,
//!     }
//! }
//! let mut total = Seen { frames: 3, dropped: 1 };
//! total.add(&Seen { frames: 2, dropped: 0 });
//! assert_eq!((total.frames, total.dropped), (5, 1));
//! ```

/// A value summed field by field (a counter, or a struct of counters).
pub trait Tally {
    /// Adds `o` to `self`.
    fn tally(&mut self, o: &Self);
}

impl Tally for u64 {
    fn tally(&mut self, o: &u64) {
        *self = self.saturating_add(*o);
    }
}

/// Declares a struct of counters (each field a `u64` or another such
/// struct) with `add`, its field-by-field sum, and a [`Tally`] impl.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $ty ),*
        }

        impl $crate::tally::Tally for $name {
            fn tally(&mut self, o: &Self) {
                $( $crate::tally::Tally::tally(&mut self.$field, &o.$field); )*
            }
        }

        impl $name {
            /// Adds `o`, field by field (the counters of another QP, lane
            /// or thread).
            pub fn add(&mut self, o: &$name) {
                $crate::tally::Tally::tally(self, o);
            }
        }
    };
}
