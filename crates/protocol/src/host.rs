//! What a Host tells a run about itself at prepare (chapter 04): its Plugins and their tools,
//! its current model, and whether its operator is a person.

/// A model's thinking capability (chapter 10): the three modes a model catalog records. The
/// one definition: the Harness's catalog, providers and scripted model use this type too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ThinkingCapability {
    /// It never thinks; the `thinking` keyword is unmet.
    #[serde(alias = "never")]
    Never,
    /// It always thinks; the `no-thinking` keyword is unmet.
    #[serde(alias = "always")]
    Always,
    /// It can switch thinking on and off per request.
    #[serde(alias = "switchable")]
    Switchable,
}

impl ThinkingCapability {
    /// `Never`, `Always` or `Switchable`, as the requirements notice names it.
    pub fn as_str(self) -> &'static str {
        match self {
            ThinkingCapability::Never => "Never",
            ThinkingCapability::Always => "Always",
            ThinkingCapability::Switchable => "Switchable",
        }
    }
}

impl std::fmt::Display for ThinkingCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Host's current model, which every declared role binds to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelInfo {
    /// The model id.
    pub id: String,
    /// Context window in tokens.
    pub context: u64,
    /// Thinking capability.
    pub thinking: ThinkingCapability,
    /// The catalog description (may be empty).
    pub description: String,
}

/// A Plugin the Harness provides.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginInfo {
    /// The Plugin id, such as `promptforge/web`.
    pub id: String,
    /// The tools it contributes.
    pub tools: Vec<ToolInfo>,
    /// Plugins it declares it conflicts with.
    pub conflicts: Vec<String>,
    /// Why it fails to activate on this Host, if it does (a notice line without the `- `).
    pub activation_failure: Option<String>,
}

/// A tool a Plugin contributes to the run's catalog.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolInfo {
    /// Its short name: `fetch` for `promptforge/web/fetch`.
    pub name: String,
    /// The description the model reads.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema), as JSON text.
    pub parameters: String,
    /// Its output is untrusted (chapter 12): every result, and every failure text a model
    /// reads, arrives in the untrusted envelope.
    pub untrusted: bool,
}

impl ToolInfo {
    /// A tool with this name and description taking no arguments.
    pub fn new(name: &str, description: &str) -> Self {
        ToolInfo {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters: r#"{"type":"object","properties":{}}"#.to_owned(),
            untrusted: false,
        }
    }
}

/// What the Host provides to a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostState {
    /// The Harness's Plugin registry.
    pub plugins: Vec<PluginInfo>,
    /// The Host's current model, if any.
    pub model: Option<ModelInfo>,
    /// The operator is a person (a terminal), whose answers come when they come; otherwise
    /// (answers given on the command line, or no operator) every question is answered at
    /// once, so the engine takes the answers in issue order like a model's.
    pub live_operator: bool,
}
