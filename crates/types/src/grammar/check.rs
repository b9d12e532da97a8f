//! The checks a grammar passes before a reader follows it, each linear in the grammar's size
//! (a request's grammar may hold a million elements, and is read on the gateway's thread):
//! every rule derives some finite text, and no rule reaches itself before reading a byte with
//! more of its alternative still to read.

use super::{Grammar, GrammarElement, GrammarError};

impl Grammar {
    /// Refuses left recursion and rules no finite text satisfies (`names` by rule, for the
    /// message).
    pub(super) fn check(&self, names: &[String]) -> Result<(), GrammarError> {
        let productive = self.least_fixed_point(true);
        if let Some(rule) = productive.iter().position(|p| !p) {
            return Err(GrammarError(format!(
                "rule {} never ends: no finite text satisfies it",
                names[rule]
            )));
        }
        let nullable = self.least_fixed_point(false);
        // A cycle of tail references reads the same stack again (the reader skips it); one
        // through a reference with something after it grows the stack without end. A reference
        // lies on a cycle exactly when both its ends are in one strongly connected component.
        let first = self.first_rules(&nullable);
        let component = components(&first);
        let growing = (0..first.len()).find(|&rule| {
            first[rule]
                .iter()
                .any(|&(to, grows)| grows && component[to as usize] == component[rule])
        });
        match growing {
            Some(rule) => Err(GrammarError(format!(
                "rule {} is left-recursive: it reaches itself before reading a character",
                names[rule]
            ))),
            None => Ok(()),
        }
    }

    /// By rule: whether it derives some finite text (`bytes`: byte elements count as derived),
    /// or the empty text (`bytes` false). A worklist, so that a long chain of rules written in
    /// the worst order costs its length, not its length squared: each alternative counts the
    /// rule references it still waits for, and a rule found derives its users' counts down.
    fn least_fixed_point(&self, bytes: bool) -> Vec<bool> {
        let num_rules = self.rules.len();
        let alternatives: Vec<(usize, u32)> = (0..num_rules)
            .flat_map(|rule| self.rules[rule].iter().map(move |&start| (rule, start)))
            .collect();
        // By alternative: references not yet derived (`None`: a byte it cannot count).
        let mut waiting: Vec<Option<u32>> = vec![Some(0); alternatives.len()];
        // By rule: the alternatives naming it, once per time.
        let mut users: Vec<Vec<u32>> = vec![Vec::new(); num_rules];
        for (i, &(_, start)) in alternatives.iter().enumerate() {
            for e in self.run(start) {
                match e {
                    GrammarElement::Rule(r) => {
                        waiting[i] = waiting[i].map(|n| n + 1);
                        users[r as usize].push(i as u32);
                    }
                    _ if !bytes => waiting[i] = None,
                    _ => {}
                }
            }
        }
        let mut derived = vec![false; num_rules];
        let mut found: Vec<usize> = Vec::new();
        let derive = |rule: usize, derived: &mut Vec<bool>, found: &mut Vec<usize>| {
            if !std::mem::replace(&mut derived[rule], true) {
                found.push(rule);
            }
        };
        for (i, &(rule, _)) in alternatives.iter().enumerate() {
            if waiting[i] == Some(0) {
                derive(rule, &mut derived, &mut found);
            }
        }
        while let Some(rule) = found.pop() {
            for &i in &users[rule] {
                let Some(n) = waiting[i as usize].as_mut() else { continue };
                *n -= 1;
                if *n == 0 {
                    derive(alternatives[i as usize].0, &mut derived, &mut found);
                }
            }
        }
        derived
    }

    /// By rule: the rules it may begin with before reading a byte, each with whether anything
    /// of its alternative is left after it (the reader's stack then grows).
    fn first_rules(&self, nullable: &[bool]) -> Vec<Vec<(u32, bool)>> {
        let first_of = |rule: &Vec<u32>| {
            let mut first = Vec::new();
            for &start in rule {
                let mut run = self.run(start).peekable();
                while let Some(GrammarElement::Rule(r)) = run.next() {
                    first.push((r, run.peek().is_some()));
                    if !nullable[r as usize] {
                        break;
                    }
                }
            }
            first
        };
        self.rules.iter().map(first_of).collect()
    }
}

/// Each rule's strongly connected component in the graph of `first` (Tarjan's algorithm, with
/// an explicit stack: a chain of rules may be far deeper than the thread's stack).
fn components(first: &[Vec<(u32, bool)>]) -> Vec<u32> {
    const UNSEEN: u32 = u32::MAX;
    let n = first.len();
    let (mut index, mut low) = (vec![UNSEEN; n], vec![0u32; n]);
    let (mut on_stack, mut stack) = (vec![false; n], Vec::new());
    let (mut component, mut num_components, mut next_index) = (vec![UNSEEN; n], 0u32, 0u32);
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        // Each open rule with the next of its edges to follow.
        let mut open = vec![(root, 0usize)];
        index[root] = next_index;
        low[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&(v, edge)) = open.last() {
            if let Some(&(w, _)) = first[v].get(edge) {
                open.last_mut().expect("open").1 += 1;
                let w = w as usize;
                if index[w] == UNSEEN {
                    index[w] = next_index;
                    low[w] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    open.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            open.pop();
            if let Some(&(parent, _)) = open.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component[w] = num_components;
                    if w == v {
                        break;
                    }
                }
                num_components += 1;
            }
        }
    }
    component
}
