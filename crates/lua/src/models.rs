//! Model roles in the section VM: model handles, `models.use` / `models.default` /
//! `models.get`, sampling options, and resolving the model a round runs on (chapter 10).
//!
//! The roles, the Host's current model and the prompt-wide default are run-wide
//! ([`ModelsState`], shared by every section VM of the run); a section's own selection lives in
//! its VM.

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{AnyUserData, Lua, MetaMethod, Table, UserData, UserDataFields, UserDataMethods, Value};
use promptforge_syntax::names::{NAME_PATTERN, is_valid_name};

use promptforge_protocol::effect::ModelTarget;

use crate::json::format_number;
use crate::raise::Raise;

/// A model's thinking capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingMode {
    /// Never thinks.
    Never,
    /// Always thinks.
    Always,
    /// Thinking can be switched per request.
    Switchable,
}

/// The Host's current model, as the catalog describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDesc {
    /// Catalog id.
    pub id: String,
    /// Context window in tokens.
    pub context: u64,
    /// Catalog description (may be empty).
    pub description: String,
    /// Thinking capability.
    pub thinking: ThinkingMode,
}

/// A declared model role.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleDesc {
    /// The role label.
    pub label: String,
    /// Keywords in declaration order (kebab-case).
    pub keywords: Vec<String>,
    /// The thinking switch: `Some(true)` for `thinking`, `Some(false)` for `no-thinking`.
    pub thinking: Option<bool>,
    /// The role's own description.
    pub description: Option<String>,
}

/// Run-wide model state shared by every section VM of a run.
#[derive(Debug, Default)]
pub struct ModelsState {
    /// Declared roles, in declaration order.
    pub roles: Vec<RoleDesc>,
    /// The Host's current model; `None` leaves every role unbound.
    pub model: Option<ModelDesc>,
    /// The prompt-wide default role, once set.
    pub default: Option<String>,
    /// Whether the Host supplied a Host-state snapshot (enables the model-id fallback).
    pub has_snapshot: bool,
    /// The run-wide `tools.always` aliases, in order, with their description overrides.
    pub tools_always: Vec<(String, Option<String>)>,
    /// Moves on whenever `tools_always` changes, so a VM can keep the list it last read.
    pub tools_always_version: u64,
    /// The prompt binds tool slots (so `tools.always` can change the run-wide list).
    pub tools_bound: bool,
    /// The VM running now belongs to a strand running ahead of the run's committed order:
    /// reading state another strand may still change, or changing it, must wait for the
    /// order (the shim's `sync`).
    pub ahead: bool,
}

impl ModelsState {
    /// Whether the prompt-wide default may still change while a strand runs ahead (it is
    /// unset and there are roles to set it to).
    pub fn default_unsettled(&self) -> bool {
        self.ahead && self.default.is_none() && !self.roles.is_empty()
    }

    /// Whether the run-wide `tools.always` list may still change while a strand runs ahead.
    pub fn tools_unsettled(&self) -> bool {
        self.ahead && self.tools_bound
    }
}

/// Sampling options set by `models.use`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sampling {
    /// `temperature`, 0.0..=2.0.
    pub temperature: Option<f64>,
    /// `max_tokens`, 1..=4294967295.
    pub max_tokens: Option<u64>,
}

/// A model handle: a frozen snapshot of a role (or a raw model id) with nine read-only fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Handle {
    /// The role label (or the raw model id).
    pub name: String,
    /// The role's description, or the model's catalog description.
    pub description: String,
    /// The role's keywords.
    pub capabilities: Vec<String>,
    /// The bound model's catalog id.
    pub model_id: String,
    /// The context window in tokens.
    pub context: u64,
    /// The role's thinking switch.
    pub thinking: Option<bool>,
    /// Sampling options from `models.use`.
    pub sampling: Sampling,
}

impl Handle {
    /// The model a round on this handle runs on.
    pub fn target(&self) -> ModelTarget {
        ModelTarget {
            name: self.name.clone(),
            model_id: self.model_id.clone(),
            context: self.context,
            thinking: self.thinking,
            temperature: self.sampling.temperature,
            max_tokens: self.sampling.max_tokens,
        }
    }
}

/// The model a section's round runs on, as the shim carries it from `round_model` to the
/// round's request, the precheck and the usage record: opaque to Lua, read in place by the
/// Rust side (no table built and converted back for every round).
#[derive(Debug, Clone)]
pub(crate) struct RoundTarget(pub(crate) ModelTarget, String);

impl UserData for RoundTarget {}

impl RoundTarget {
    pub(crate) fn new(target: ModelTarget) -> Self {
        let key = format!("{}\u{0}{}", target.name, target.model_id);
        RoundTarget(target, key)
    }

    /// The key the usage memory files a round's usage under: the role and the model.
    pub(crate) fn usage_key(&self) -> &str {
        &self.1
    }
}

impl UserData for Handle {
    fn add_fields<F: UserDataFields<Self>>(_fields: &mut F) {}

    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_meta_method(MetaMethod::Index, |lua, this, key: Value| {
            let key = match key {
                Value::String(s) => s.to_string_lossy(),
                other => {
                    return Err(Raise::lua(format!(
                        "attempt to get an unknown field '{}'",
                        other.to_string().unwrap_or_default()
                    ))
                    .into());
                }
            };
            Ok(match key.as_str() {
                "name" | "label" => Value::String(lua.create_string(&this.name)?),
                "description" => Value::String(lua.create_string(&this.description)?),
                "capabilities" => Value::Table(
                    lua.create_sequence_from(this.capabilities.iter().map(String::as_str))?,
                ),
                "model_id" => Value::String(lua.create_string(&this.model_id)?),
                "context" => Value::Integer(i64::try_from(this.context).unwrap_or(i64::MAX)),
                "thinking" => this.thinking.map_or(Value::Nil, Value::Boolean),
                "temperature" => this.sampling.temperature.map_or(Value::Nil, Value::Number),
                "max_tokens" => this.sampling.max_tokens.map_or(Value::Nil, |n| {
                    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
                }),
                other => {
                    return Err(
                        Raise::lua(format!("attempt to get an unknown field '{other}'")).into(),
                    );
                }
            })
        });
        methods.add_meta_method(
            MetaMethod::NewIndex,
            |_, _this, (key, _value): (Value, Value)| -> mlua::Result<()> {
                Err(Raise::lua(format!(
                    "model handle fields are read-only; cannot set '{}'",
                    key.to_string().unwrap_or_default()
                ))
                .into())
            },
        );
        methods.add_meta_method(MetaMethod::ToString, |_, this, ()| {
            Ok(format!("model handle {} ({})", this.name, this.model_id))
        });
    }
}

/// The Lua type name argument errors use: `integer` for an integer, `number` for a float.
pub fn arg_type_name(value: &Value) -> &'static str {
    match value {
        Value::Integer(_) => "integer",
        Value::Number(_) => "number",
        other => crate::json::lua_type_name(other),
    }
}

fn invalid_alias(name: &str) -> String {
    format!("invalid alias \"{name}\": expected {NAME_PATTERN}")
}

fn label_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.to_string_lossy(),
        Value::Nil => String::new(),
        other => other.to_string().unwrap_or_default(),
    }
}

impl ModelsState {
    fn role(&self, label: &str) -> Option<&RoleDesc> {
        self.roles.iter().find(|r| r.label == label)
    }

    /// The handle of a bound role (roles are bound only when the Host has a current model).
    pub fn role_handle(&self, label: &str, sampling: Sampling) -> Option<Handle> {
        let model = self.model.as_ref()?;
        let role = self.role(label)?;
        Some(Handle {
            name: role.label.clone(),
            description: role
                .description
                .clone()
                .unwrap_or_else(|| model.description.clone()),
            capabilities: role.keywords.clone(),
            model_id: model.id.clone(),
            context: model.context,
            thinking: role.thinking,
            sampling,
        })
    }

    /// Every bound role's handle, for the role globals.
    pub fn bound_handles(&self) -> Vec<Handle> {
        self.roles
            .iter()
            .filter_map(|r| self.role_handle(&r.label, Sampling::default()))
            .collect()
    }
}

/// `models.use(label, options?)`: the handle to select, or the rejection message.
pub fn models_use(
    state: &ModelsState,
    count: usize,
    label: &Value,
    options: &Value,
) -> Result<Handle, String> {
    if count > 2 {
        return Err(format!("models.use takes at most 2 arguments, got {count}"));
    }
    let label = label_text(label);
    if !is_valid_name(&label) {
        return Err(invalid_alias(&label));
    }
    let sampling = parse_options(options)?;
    state
        .role_handle(&label, sampling)
        .ok_or_else(|| format!("models.use label \"{label}\" is not a bound model role"))
}

/// `models.default(label)`: sets the prompt-wide default (once) and returns its handle.
pub fn models_default(state: &mut ModelsState, label: &Value) -> Result<Handle, String> {
    let label = label_text(label);
    if !is_valid_name(&label) {
        return Err(invalid_alias(&label));
    }
    let handle = state
        .role_handle(&label, Sampling::default())
        .ok_or_else(|| format!("models.default label \"{label}\" is not a bound model role"))?;
    match &state.default {
        Some(existing) if *existing != label => Err(format!(
            "models.default is already \"{existing}\": the prompt-wide default cannot change mid-run"
        )),
        _ => {
            state.default = Some(label);
            Ok(handle)
        }
    }
}

/// `models.get(name)`: a declared role's handle, else (with a snapshot) a raw model id handle.
pub fn models_get(state: &ModelsState, name: &Value) -> Result<Handle, String> {
    let name = label_text(name);
    if let Some(handle) = state.role_handle(&name, Sampling::default()) {
        return Ok(handle);
    }
    if state.has_snapshot {
        if name.is_empty() {
            return Err(format!(
                "models.get model id \"{name}\" is invalid: it is empty"
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(format!(
                "models.get model id \"{}\" is invalid: it contains a control character",
                name.escape_default()
            ));
        }
        return Ok(Handle {
            name: name.clone(),
            description: name.clone(),
            capabilities: Vec::new(),
            model_id: name,
            context: 8192,
            thinking: None,
            sampling: Sampling::default(),
        });
    }
    if !is_valid_name(&name) {
        return Err(invalid_alias(&name));
    }
    Err(format!(
        "models.get alias \"{name}\" is not a bound model role"
    ))
}

/// Validate `models.use` options. Non-string keys are checked first (grouped by type name),
/// then string names in bytewise order, so the first error is the same on every run.
pub fn parse_options(options: &Value) -> Result<Sampling, String> {
    let table: &Table = match options {
        Value::Nil => return Ok(Sampling::default()),
        Value::Table(t) => t,
        other => {
            return Err(format!(
                "models.use options must be a table, got {}",
                arg_type_name(other)
            ));
        }
    };
    let mut non_string: Vec<&'static str> = Vec::new();
    let mut named: Vec<(Vec<u8>, Value)> = Vec::new();
    for pair in table.pairs::<Value, Value>() {
        let (key, value) = pair.map_err(|e| e.to_string())?;
        match key {
            Value::String(s) => named.push((s.as_bytes().to_vec(), value)),
            other => non_string.push(arg_type_name(&other)),
        }
    }
    non_string.sort_unstable();
    if let Some(first) = non_string.first() {
        return Err(format!(
            "models.use option names must be strings, got {first}"
        ));
    }
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut sampling = Sampling::default();
    for (name, value) in named {
        match name.as_slice() {
            b"temperature" => {
                let t = match value {
                    Value::Integer(i) => i as f64,
                    Value::Number(n) => n,
                    other => {
                        return Err(format!(
                            "models.use option temperature must be a number, got {}",
                            arg_type_name(&other)
                        ));
                    }
                };
                if !t.is_finite() {
                    return Err(format!(
                        "models.use option temperature must be finite, got {}",
                        format_number(t)
                    ));
                }
                if !(0.0..=2.0).contains(&t) {
                    return Err(format!(
                        "models.use option temperature {} is outside the supported range [0.0, 2.0]",
                        format_number(t)
                    ));
                }
                sampling.temperature = Some(t);
            }
            b"max_tokens" => {
                let bad = |actual: String| {
                    format!(
                        "models.use option max_tokens must be an integer in [1, 4294967295], got {actual}"
                    )
                };
                let n = match value {
                    Value::Integer(i) => i,
                    Value::Number(n) if n.is_finite() && n.fract() == 0.0 && n.abs() < 9.0e18 => {
                        n as i64
                    }
                    Value::Number(n) => return Err(bad(format_number(n))),
                    other => return Err(bad(arg_type_name(&other).to_owned())),
                };
                if !(1..=4_294_967_295).contains(&n) {
                    return Err(bad(n.to_string()));
                }
                sampling.max_tokens = u64::try_from(n).ok();
            }
            other => {
                return Err(format!(
                    "models.use option \"{}\" is unknown: expected temperature or max_tokens",
                    String::from_utf8_lossy(other)
                ));
            }
        }
    }
    Ok(sampling)
}

/// Borrow a handle out of a Lua value, if it is one.
pub fn as_handle(value: &Value) -> Option<Handle> {
    match value {
        Value::UserData(ud) => ud.borrow::<Handle>().ok().map(|h| h.clone()),
        _ => None,
    }
}

/// Create the Lua userdata for a handle.
pub fn handle_value(lua: &Lua, handle: Handle) -> mlua::Result<AnyUserData> {
    lua.create_userdata(handle)
}

/// What a round runs on: the explicit handle, else the section's selection, else the
/// prompt-wide default; `None` is the missing-model case.
pub fn round_handle(
    state: &Rc<RefCell<ModelsState>>,
    explicit: Option<Handle>,
    selection: Option<&(String, Sampling)>,
) -> Option<Handle> {
    if explicit.is_some() {
        return explicit;
    }
    let st = state.borrow();
    if let Some((label, sampling)) = selection {
        return st.role_handle(label, *sampling);
    }
    let default = st.default.clone()?;
    st.role_handle(&default, Sampling::default())
}
