//! The search for one gang in one scope: the shortest cheapest-first prefix of the eligible
//! units whose removal lets it fit (bisection), then the reprieve (see the parent's doc).
//!
//! **Speed, same answers.** Every probe asks whether the gang fits with a set of units gone.
//! Two things make a probe cheap without changing its answer:
//!
//! - An aggregate check first: the gang's main accelerator, all its members and phantoms
//!   together, against what is free (never counted below zero) on the nodes of the scope that
//!   one of its placement classes admits, plus what the units gone hold there. Placing a member
//!   needs that much free on one such node, so when the sum is short the gang cannot fit, and
//!   the probe answers no without touching the simulation; the units are then not even evicted
//!   (the state follows the probes lazily).
//! - Inside a domain, a gang of members all of one shape and no phantoms is tested by counting
//!   copies of that shape on a copy of the domain's free capacity (`copies`): the same answer
//!   as placing it, without placing, and the units are evicted from that copy only.
//!
//! Anything else (members of several shapes, phantoms, no required domain) is probed by placing
//! the gang, as [`Simulation::place_for`] would.

use super::copies::{Copies, Uniform};
use super::{Candidates, Placed, Preemptor, WaitingGang};
use crate::control::gang::decision::Simulation;
use crate::control::gang::decision::topology::main_amount;

/// What one gang's search asks, the same at every scope it tries: the gang, the candidates it
/// may take, and what it needs.
#[derive(Clone, Copy)]
pub(super) struct Ask<'a> {
    pub(super) gang: &'a WaitingGang,
    pub(super) who: &'a Eligible<'a>,
    pub(super) demand: &'a Demand<'a>,
}

/// What a gang asks, for the aggregate check and the copy count (once per gang).
pub(super) struct Demand<'g> {
    /// The placement classes of its members and phantoms, ascending, each once.
    pub(super) classes: Vec<usize>,
    /// The nodes one of them admits, ascending.
    pub(super) nodes: Vec<usize>,
    /// Its first member's main accelerator, and how much of it all members and phantoms ask
    /// (nanos); `None`: it asks no accelerator, and no aggregate check applies.
    pub(super) main: Option<(String, i128)>,
    /// The column of that accelerator in what the candidates' pods ask ([`Candidates::asked`]).
    held: Option<Option<usize>>,
    /// Members all of one shape (and no phantoms).
    pub(super) uniform: Option<Uniform<'g>>,
}

impl<'g> Demand<'g> {
    pub(super) fn of(sim: &mut Simulation<'_>, candidates: &Candidates<'_>, gang: &'g WaitingGang) -> Demand<'g> {
        let uniform = Uniform::of(sim, candidates, gang);
        // (Each class is a placement key built from the shape: one shape, one class.)
        let mut classes = match &uniform {
            Some(uniform) => vec![uniform.class],
            None => sim.classes_of(gang),
        };
        classes.sort_unstable();
        let mut nodes: Vec<usize> = classes.iter().flat_map(|&c| sim.class_nodes[c].iter().copied()).collect();
        if classes.len() > 1 {
            nodes.sort_unstable();
            nodes.dedup();
        }
        let main = main_amount(gang).map(|(resource, needed)| (resource, needed.nanos()));
        let held = main.as_ref().map(|(resource, _)| candidates.column(resource));
        Demand { classes, nodes, main, held, uniform }
    }

    fn admits(&self, sim: &Simulation<'_>, node: usize) -> bool {
        self.classes.iter().any(|&c| sim.class_member[c][node])
    }

    /// Free main accelerator on `node`, never below zero (nanos).
    pub(super) fn free_on(&self, sim: &Simulation<'_>, node: usize) -> i128 {
        let Some((resource, _)) = &self.main else { return 0 };
        sim.free[node].get(resource).map_or(0, |q| q.nanos().max(0))
    }
}

/// Which candidates a gang may evict: of lower priority (the first `lower`), not taken this
/// pass, past their `evictable_from`, its team's to evict, and on some node it may use.
pub(super) struct Eligible<'a> {
    pub(super) lower: usize,
    pub(super) preemptor: &'a Preemptor,
    /// The preemptor's team among the candidates' (`None`: none of them is of its team).
    pub(super) team: Option<usize>,
    /// The nodes it may use, and which of the pass's sets of usable nodes that is.
    pub(super) usable: &'a [bool],
    pub(super) usable_id: usize,
}

impl Eligible<'_> {
    pub(super) fn admits(&self, candidates: &Candidates<'_>, v: usize) -> bool {
        v < self.lower
            && !candidates.taken[v]
            && candidates.evictable[v]
            && candidates.pod_nodes(v).iter().flatten().any(|&i| self.usable[i])
            && self.may_evict(candidates.team_of[v])
    }

    /// [`Preemptor::may_evict_work`], the teams by their index among the candidates'.
    fn may_evict(&self, team: Option<usize>) -> bool {
        self.preemptor.may_evict_work(team.is_some() && team == self.team)
    }
}

/// One search's probes (the bisection): what each eligible unit frees for the aggregate check,
/// how the state is changed and how a fit is judged.
struct Probe<'a> {
    eligible: &'a [usize],
    scope: Option<&'a [usize]>,
    /// By eligible position: the main accelerator it holds on the scope's admitted nodes.
    freed: Vec<i128>,
    /// `prefix[k]`: what the first `k` free together.
    prefix: Vec<i128>,
    /// Free on the scope's admitted nodes now, and what the gang asks (`i128::MIN`: no check).
    free: i128,
    need: i128,
    /// How a fit is judged: by placing the gang (units evicted from the simulation), or by
    /// counting copies of its one shape (units evicted from the count's own copy).
    copies: Option<Copies<'a>>,
    /// Eligible positions `..removed` are evicted (while the state is a prefix).
    removed: usize,
}

impl<'a> Probe<'a> {
    fn new(
        sim: &Simulation<'_>,
        candidates: &Candidates<'_>,
        eligible: &'a [usize],
        scope: Option<&'a [usize]>,
        demand: &'a Demand<'_>,
        copies: Option<Copies<'a>>,
    ) -> Probe<'a> {
        let in_scope = |i: usize| scope.is_none_or(|s| s.binary_search(&i).is_ok());
        let relevant = |i: usize| in_scope(i) && demand.admits(sim, i);
        // (A request below zero frees nothing: counting it would make the sum short of what a
        // placement could find.)
        let held = |v: usize| -> Option<i128> {
            let Some(main) = demand.held else { return Some(0) };
            let on = candidates.pod_nodes(v).iter().enumerate().filter(|(_, node)| node.is_some_and(relevant));
            let mut asked = on.map(|(k, _)| candidates.asked(candidates.first_pod(v) + k, main).max(0));
            asked.try_fold(0i128, i128::checked_add)
        };
        let freed: Option<Vec<i128>> = eligible.iter().map(|&v| held(v)).collect();
        let free_now = |i: usize| demand.free_on(sim, i);
        let free = match scope {
            Some(nodes) => {
                nodes.iter().copied().filter(|&i| demand.admits(sim, i)).map(free_now).try_fold(0, i128::checked_add)
            }
            None => demand.nodes.iter().copied().map(free_now).try_fold(0, i128::checked_add),
        };
        let prefix = freed.as_ref().and_then(|freed| {
            let mut prefix = Vec::with_capacity(freed.len() + 1);
            prefix.push(0i128);
            for f in freed {
                prefix.push(prefix[prefix.len() - 1].checked_add(*f)?);
            }
            free?.checked_add(prefix[prefix.len() - 1])?;
            Some(prefix)
        });
        // Sums past i128 (quantities a tenant wrote) would make the check unsound: none then.
        let (freed, prefix, free, need) = match (freed, prefix, free, &demand.main) {
            (Some(freed), Some(prefix), Some(free), Some((_, need))) => (freed, prefix, free, *need),
            _ => (vec![0; eligible.len()], vec![0; eligible.len() + 1], 0, i128::MIN),
        };
        Probe { eligible, scope, freed, prefix, free, need, copies, removed: 0 }
    }

    /// The aggregate check: false when `freed` more cannot make room, whatever the placement.
    fn may_fit(&self, freed: i128) -> bool {
        self.free + freed >= self.need
    }

    /// Evicts (`sign` -1) or restores (1) the unit at eligible position `k`.
    fn apply(&mut self, sim: &mut Simulation<'_>, candidates: &Candidates<'_>, k: usize, sign: i128) {
        match &mut self.copies {
            None => sim.evict(candidates, self.eligible[k], sign),
            Some(copies) => copies.apply(candidates, k, sign),
        }
    }

    /// Makes the state the first `to` evicted.
    fn evict_prefix(&mut self, sim: &mut Simulation<'_>, candidates: &Candidates<'_>, to: usize) {
        while self.removed < to {
            self.apply(sim, candidates, self.removed, -1);
            self.removed += 1;
        }
        while self.removed > to {
            self.removed -= 1;
            self.apply(sim, candidates, self.removed, 1);
        }
    }

    /// Whether the gang fits the current state.
    fn fits(&mut self, sim: &mut Simulation<'_>, gang: &WaitingGang) -> bool {
        match &mut self.copies {
            None => sim.fits_within(gang, self.scope).is_some(),
            Some(copies) => copies.fit(),
        }
    }
}

impl Simulation<'_> {
    /// The smallest cheapest-first prefix of `eligible` whose removal lets the gang fit within
    /// `scope`, then each victim given back (most expensive first) where it is not needed: the
    /// victims, as candidate indices. `None` when even all of them do not make room. The
    /// simulation is left as it was.
    pub(super) fn smallest_set(
        &mut self,
        gang: &WaitingGang,
        candidates: &Candidates<'_>,
        eligible: &[usize],
        scope: Option<&[usize]>,
        demand: &Demand<'_>,
    ) -> Option<Vec<usize>> {
        let mut copies = self.copies(gang, eligible, scope, demand);
        // Where nothing asks below zero, evicting more never lowers a count: one pass suffices.
        if let Some(copies) = copies.as_mut().filter(|_| candidates.monotone) {
            return Some(copies.smallest(candidates)?.into_iter().map(|k| eligible[k]).collect());
        }
        let mut probe = Probe::new(self, candidates, eligible, scope, demand, copies);
        let len = eligible.len();
        let fits_prefix = |sim: &mut Self, probe: &mut Probe<'_>, k: usize| {
            probe.may_fit(probe.prefix[k]) && {
                probe.evict_prefix(sim, candidates, k);
                probe.fits(sim, gang)
            }
        };
        if !fits_prefix(self, &mut probe, len) {
            probe.evict_prefix(self, candidates, 0);
            return None;
        }
        // Fit is monotone in the prefix: the smallest one that fits, by bisection.
        let (mut lo, mut hi) = (0, len);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits_prefix(self, &mut probe, mid) { hi = mid } else { lo = mid }
        }
        probe.evict_prefix(self, candidates, hi);
        // Give back the most expensive first while the gang still fits without them.
        let mut victims: Vec<usize> = (0..hi).collect();
        let mut freed = probe.prefix[hi];
        for index in (0..victims.len()).rev() {
            let k = victims[index];
            let without = freed - probe.freed[k];
            if !probe.may_fit(without) {
                continue;
            }
            probe.apply(self, candidates, k, 1);
            if probe.fits(self, gang) {
                victims.remove(index);
                freed = without;
            } else {
                probe.apply(self, candidates, k, -1);
            }
        }
        for &k in &victims {
            probe.apply(self, candidates, k, 1);
        }
        Some(victims.into_iter().map(|k| eligible[k]).collect())
    }

    /// The copy count for a gang of one shape inside a domain, or on all nodes without topology
    /// (`None`: it is probed by placing it).
    fn copies<'a>(
        &self,
        gang: &WaitingGang,
        eligible: &'a [usize],
        scope: Option<&[usize]>,
        demand: &'a Demand<'_>,
    ) -> Option<Copies<'a>> {
        let uniform = demand.uniform.as_ref()?;
        match scope {
            Some(nodes) => {
                let nodes: Vec<usize> =
                    nodes.iter().copied().filter(|&i| self.class_member[uniform.class][i]).collect();
                Some(Copies::new(self, eligible, &nodes, uniform))
            }
            // (With a topology, even a preferred one, `place_for` tries domains first.)
            None if gang.topology.is_none() => {
                Copies::anywhere(self, eligible, &self.class_nodes[uniform.class], uniform)
            }
            None => None,
        }
    }

    /// Where the gang goes within `scope` with `victims` gone: for a gang of one shape inside a
    /// domain, read from a copy of the domain's free capacity as placing it would; otherwise
    /// [`Simulation::placed_without`].
    pub(super) fn place_after(
        &mut self,
        gang: &WaitingGang,
        candidates: &Candidates<'_>,
        demand: &Demand<'_>,
        victims: &[usize],
        scope: Option<&[usize]>,
    ) -> Option<Placed> {
        let (Some(nodes), Some(uniform)) = (scope, &demand.uniform) else {
            return self.placed_without(gang, candidates, victims, scope);
        };
        let nodes: Vec<usize> = nodes.iter().copied().filter(|&i| self.class_member[uniform.class][i]).collect();
        let mut copies = Copies::new(self, victims, &nodes, uniform);
        for k in 0..victims.len() {
            copies.apply(candidates, k, -1);
        }
        Some((copies.place(self, gang)?, None))
    }

    /// Where the gang goes within `scope` with `victims` gone, placed for real (every index kept
    /// up to date). Asked only of the set chosen: the probes' answer is the same (the set fits),
    /// the placement is what costs. The simulation is left as it was.
    pub(super) fn placed_without(
        &mut self,
        gang: &WaitingGang,
        candidates: &Candidates<'_>,
        victims: &[usize],
        scope: Option<&[usize]>,
    ) -> Option<Placed> {
        for &v in victims {
            self.evict(candidates, v, -1);
        }
        let placements = self.fits_within(gang, scope);
        for &v in victims {
            self.evict(candidates, v, 1);
        }
        placements
    }
}
