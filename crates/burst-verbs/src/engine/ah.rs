//! Address handles: owned, numbered by the engine and shared per destination.

use std::collections::HashMap;

use super::*;

/// The address handles of a device: numbered by the engine's context (the
/// same number on every lane), owned by the client that created them, and
/// shared within a client by destination: an application that creates an
/// AH per message to one peer (or a modify per connection) reuses one
/// entry, counted. Destroyed with its last reference or with its client.
#[derive(Debug, Default)]
pub(super) struct AhTable {
    /// Destination -> (index, references).
    pub(super) by_dest: HashMap<AhKey, (u32, u32)>,
    /// index -> destination.
    pub(super) by_index: HashMap<u32, AhKey>,
    pub(super) free: Vec<u32>,
    pub(super) next: u32,
}

/// Who holds an AH and where it goes: (owner, dgid, sgid index).
pub(super) type AhKey = (u32, [u8; 16], Option<u8>);

impl AhTable {
    pub(super) fn take_index(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

impl Context {
    /// Creates an address handle for destination GID `gid`, sent to from
    /// the device's own address ([`Context::gid`]).
    pub fn create_ah(&self, gid: [u8; 16]) -> Result<u32, PostError> {
        self.create_ah_from(gid, None)
    }

    /// Creates an address handle for destination GID `gid`, sent to from
    /// the device's GID at `sgid_index` ([`Context::gid_table`]; `None`:
    /// its own address); an empty index, or GIDs of different IP versions,
    /// are refused ([`crate::VerbsError::InvalidValue`], EINVAL).
    pub fn create_ah_from(&self, gid: [u8; 16], sgid_index: Option<u8>) -> Result<u32, PostError> {
        self.plane.create_ah(self, gid, sgid_index)
    }

    /// [`Context::create_ah_from`] on this process's engine: numbered
    /// here, shared per (owner, destination, source) with a count.
    pub(super) fn create_ah_here(
        &self,
        gid: [u8; 16],
        sgid_index: Option<u8>,
    ) -> Result<u32, PostError> {
        let key = (self.owner, gid, sgid_index);
        let (index, reused) = {
            let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
            match t.by_dest.get(&key) {
                Some((i, _)) => (*i, true),
                None => (t.take_index(), false),
            }
        };
        // Every lane holds every address handle, under the same number
        // (lanes share one GID table: with several, the device's address).
        // A reused entry is made again: the GID table may have changed.
        let made = (0..self.control.len()).try_for_each(|lane| {
            self.call_on(lane, |reply| Control::CreateAh {
                index,
                owner: self.owner,
                gid,
                sgid_index,
                reply,
            })?
            .map(|_| ())
            .map_err(PostError::Refused)
        });
        let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
        if reused {
            made?;
            match t.by_dest.get_mut(&key) {
                Some((i, refs)) if *i == index => *refs += 1,
                // Destroyed meanwhile by another thread of the client.
                _ => {
                    t.by_dest.insert(key, (index, 1));
                    t.by_index.insert(index, key);
                }
            }
            return Ok(index);
        }
        match made {
            Ok(()) => {
                t.by_dest.insert(key, (index, 1));
                t.by_index.insert(index, key);
                Ok(index)
            }
            Err(e) => {
                t.free.push(index);
                Err(e)
            }
        }
    }

    /// `ibv_destroy_ah`: drops one reference to this client's AH `ah`
    /// (the entry goes with the last); `NoSuch` for another client's.
    pub fn destroy_ah(&self, ah: u32) -> Result<(), PostError> {
        self.plane.destroy_ah(self, ah)
    }

    /// Drops one reference to this owner's AH `ah` (every reference with
    /// `all`: the client is gone); the last removes it from every lane.
    pub(super) fn release_ah(&self, ah: u32, all: bool) -> Result<(), PostError> {
        {
            let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
            let key = match t.by_index.get(&ah) {
                Some(k) if k.0 == self.owner => *k,
                _ => return Err(PostError::NoSuch),
            };
            if let Some((_, refs)) = t.by_dest.get_mut(&key) {
                *refs = if all { 0 } else { refs.saturating_sub(1) };
                if *refs > 0 {
                    return Ok(());
                }
            }
            t.by_dest.remove(&key);
            t.by_index.remove(&ah);
        }
        for lane in 0..self.control.len() {
            self.call_on(lane, |reply| Control::DestroyAh { index: ah, reply })?;
        }
        self.shared
            .ahs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(ah);
        Ok(())
    }
}
