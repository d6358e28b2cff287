// Loading a Hugging Face tokenizer.json and encoding with it; see hf_tokenizer.h for what is read.
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_files.h"

namespace layup {
namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenization pattern, which tokenizers' ByteLevel pre-tokenizer runs when its
// use_regex is on.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string describe(const Json& value) {
  const std::string text = value.dump();
  return std::string(value.type_name()) + " " +
         (text.size() > 60 ? text.substr(0, 57) + "..." : text);
}

// One JSON object of the file, read field by field. `path` ("model", "added_tokens[3]") and the
// file name start every error.
class Fields {
 public:
  Fields(const Json& value, std::string path, const std::string& source)
      : value_(value), path_(std::move(path)), source_(source) {
    LAYUP_CHECK(value.is_object(), source_, ": ", path_.empty() ? "the top level" : path_,
                " must be a JSON object, found ", describe(value));
  }

  // Refuses a field not among `known`: a field layup does not read might change the ids.
  void allow_only(std::initializer_list<std::string_view> known) const {
    for (const auto& item : value_.items()) {
      if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
        fail(source_, ": ", name(item.key()),
             " is a field layup does not know; it is refused rather than ignored, as it may "
             "change the tokens");
      }
    }
  }

  std::string name(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  // The field, or nullptr when it is absent or null.
  const Json* find(std::string_view key) const {
    const auto found = value_.find(key);
    return found == value_.end() || found->is_null() ? nullptr : &*found;
  }
  const Json& at(std::string_view key) const {
    const Json* value = find(key);
    LAYUP_CHECK(value != nullptr, source_, ": ", name(key), " is missing");
    return *value;
  }
  std::string string(std::string_view key) const {
    const Json& value = at(key);
    LAYUP_CHECK(value.is_string(), source_, ": ", name(key), " must be a string, found ",
                describe(value));
    return value.get<std::string>();
  }
  bool boolean(std::string_view key, bool if_absent) const {
    const Json* value = find(key);
    if (value == nullptr) return if_absent;
    LAYUP_CHECK(value->is_boolean(), source_, ": ", name(key), " must be true or false, found ",
                describe(*value));
    return value->get<bool>();
  }
  int64_t integer(std::string_view key) const {
    const Json& value = at(key);
    LAYUP_CHECK(value.is_number_integer(), source_, ": ", name(key), " must be an integer, found ",
                describe(value));
    return value.get<int64_t>();
  }
  // Refuses the field unless it is absent, null, or `allowed`: for options layup does not
  // implement, `why` says what they would do.
  void require(std::string_view key, const Json& allowed, std::string_view why) const {
    const Json* value = find(key);
    if (value == nullptr || *value == allowed) return;
    fail(source_, ": ", name(key), " is ", value->dump(), "; layup supports only ", allowed.dump(),
         " (", why, ")");
  }
  const Json& array(std::string_view key) const {
    const Json& value = at(key);
    LAYUP_CHECK(value.is_array(), source_, ": ", name(key), " must be a JSON array, found ",
                describe(value));
    return value;
  }

 private:
  const Json& value_;
  std::string path_;
  const std::string& source_;
};

std::string element(std::string_view array_path, size_t index) {
  return std::string(array_path) + "[" + std::to_string(index) + "]";
}

}  // namespace

HfTokenizer HfTokenizer::from_file(const std::string& tokenizer_json_path) {
  return from_json(read_tokenizer_file(tokenizer_json_path), tokenizer_json_path);
}

HfTokenizer HfTokenizer::from_json(std::string_view json_text, const std::string& source) {
  LAYUP_CHECK(!json_text.empty(), source, ": the file is empty; expected a tokenizer.json");
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& error) {
    fail(source, ": not valid JSON (", error.what(), ")");
  }
  HfTokenizer tokenizer;
  tokenizer.source_ = source;
  const Fields fields(root, "", source);
  fields.allow_only({"version", "truncation", "padding", "added_tokens", "normalizer",
                     "pre_tokenizer", "model", "post_processor", "decoder"});
  fields.require("truncation", nullptr, "truncation cuts the ids of long texts");
  fields.require("padding", nullptr, "padding adds ids to short texts");
  if (const Json* normalizer = fields.find("normalizer")) {
    const Fields normalizer_fields(*normalizer, "normalizer", source);
    const std::string type = normalizer_fields.string("type");
    normalizer_fields.allow_only({"type"});
    const std::pair<std::string_view, NormalizationForm> kForms[] = {
        {"NFC", NormalizationForm::kNfc},
        {"NFD", NormalizationForm::kNfd},
        {"NFKC", NormalizationForm::kNfkc},
        {"NFKD", NormalizationForm::kNfkd}};
    for (const auto& [name, form] : kForms) {
      if (type == name) tokenizer.normalizer_ = form;
    }
    LAYUP_CHECK(tokenizer.normalizer_.has_value(), source, ": normalizer.type is \"", type,
                "\"; layup implements the normalizers NFC, NFD, NFKC and NFKD, and encoding "
                "without this one would give other ids");
  }

  if (const Json* added = fields.find("added_tokens")) {
    LAYUP_CHECK(added->is_array(), source, ": added_tokens must be a JSON array, found ",
                describe(*added));
    tokenizer.read_added_tokens(*added);
  }
  tokenizer.read_model(fields.at("model"));
  const Json* pre_tokenizer = fields.find("pre_tokenizer");
  LAYUP_CHECK(pre_tokenizer != nullptr, source,
              ": pre_tokenizer is missing or null; a byte-level BPE needs a ByteLevel "
              "pre-tokenizer, which maps the text's bytes to the alphabet its vocabulary is "
              "spelled in");
  tokenizer.read_pre_tokenizer(*pre_tokenizer);
  if (const Json* post_processor = fields.find("post_processor")) {
    tokenizer.read_post_processor(*post_processor, "post_processor");
  }
  if (const Json* decoder = fields.find("decoder")) {
    const Fields decoder_fields(*decoder, "decoder", source);
    const std::string type = decoder_fields.string("type");
    LAYUP_CHECK(type == "ByteLevel", source, ": decoder.type is \"", type,
                "\"; layup decodes byte-level BPE only (decoder ByteLevel, or null)");
  }

  // The separator for token shards, as hf_tokenizer.h says.
  if (!tokenizer.template_before_.empty()) {
    tokenizer.document_separator_ = tokenizer.template_before_.front();
  } else {
    for (std::string_view name : {"<|endoftext|>", "<|end_of_text|>"}) {
      for (const AddedToken& token : tokenizer.added_tokens_) {
        if (token.special && token.content == name && !tokenizer.document_separator_) {
          tokenizer.document_separator_ = token.id;
        }
      }
    }
  }
  return tokenizer;
}

void HfTokenizer::read_added_tokens(const Json& added_tokens) {
  std::unordered_map<int32_t, size_t> index_of_id;
  std::unordered_map<std::string, size_t> index_of_content;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const std::string path = element("added_tokens", i);
    const Fields fields(added_tokens[i], path, source_);
    fields.allow_only(
        {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
    constexpr std::string_view kWhy = "it changes which text matches the token";
    fields.require("single_word", false, kWhy);
    fields.require("lstrip", false, kWhy);
    fields.require("rstrip", false, kWhy);
    AddedToken token;
    token.content = fields.string("content");
    const int64_t id = fields.integer("id");
    LAYUP_CHECK(id >= 0 && id < (int64_t{1} << 31) - 1, source_, ": ", path, ".id is ", id,
                "; ids run from 0");
    token.id = static_cast<int32_t>(id);
    token.special = fields.boolean("special", false);
    // tokenizers' default: a special token matches the raw text, any other the normalized text.
    token.normalized = fields.boolean("normalized", !token.special);
    LAYUP_CHECK(!token.content.empty(), source_, ": ", path, ".content is empty");
    if (const auto other = index_of_id.find(token.id); other != index_of_id.end()) {
      fail(source_, ": added tokens ", quoted(added_tokens_[other->second].content), " and ",
           quoted(token.content), " both have id ", token.id);
    }
    if (const auto other = index_of_content.find(token.content); other != index_of_content.end()) {
      fail(source_, ": the added token ", quoted(token.content), " is there twice (ids ",
           added_tokens_[other->second].id, " and ", token.id, ")");
    }
    index_of_id.emplace(token.id, i);
    index_of_content.emplace(token.content, i);
    added_tokens_.push_back(std::move(token));
  }
  for (size_t index = 0; index < added_tokens_.size(); ++index) {
    const AddedToken& token = added_tokens_[index];
    AddedTokenPass& pass = added_token_passes_[token.normalized ? 1 : 0];
    pass.first_byte[static_cast<unsigned char>(token.content[0])] = true;
    pass.lengths.push_back(token.content.size());
    pass.index_of_content.emplace(token.content, index);
  }
  for (AddedTokenPass& pass : added_token_passes_) {
    std::sort(pass.lengths.begin(), pass.lengths.end(), std::greater<>());
    pass.lengths.erase(std::unique(pass.lengths.begin(), pass.lengths.end()), pass.lengths.end());
  }
}

void HfTokenizer::read_model(const Json& model) {
  const Fields fields(model, "model", source_);
  const std::string type = fields.string("type");
  LAYUP_CHECK(type == "BPE", source_, ": model.type is \"", type,
              "\"; layup reads byte-level BPE models only (\"BPE\")");
  fields.allow_only({"type", "dropout", "unk_token", "continuing_subword_prefix",
                     "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges", "vocab",
                     "merges"});
  fields.require("dropout", nullptr, "dropout merges at random");
  fields.require("byte_fallback", false,
                 "byte-level BPE has a token for every byte and needs no fallback");
  fields.require("continuing_subword_prefix", "", "it marks tokens that continue a word");
  fields.require("end_of_word_suffix", "", "it marks tokens that end a word");
  ignore_merges_ = fields.boolean("ignore_merges", false);

  const Json& vocab = fields.at("vocab");
  LAYUP_CHECK(vocab.is_object(), source_,
              ": model.vocab must be a JSON object (token -> id), found ", describe(vocab));
  LAYUP_CHECK(!vocab.empty(), source_, ": model.vocab is empty");

  // Ids: every one of 0..max given once, by model.vocab or by an added token.
  int64_t max_id = -1;
  for (const auto& item : vocab.items()) {
    LAYUP_CHECK(item.value().is_number_integer() && item.value().get<int64_t>() >= 0, source_,
                ": model.vocab gives the token ", quoted(item.key()), " the id ",
                item.value().dump(), ", not a non-negative integer");
    max_id = std::max(max_id, item.value().get<int64_t>());
  }
  for (const AddedToken& token : added_tokens_) max_id = std::max<int64_t>(max_id, token.id);
  LAYUP_CHECK(max_id < (int64_t{1} << 31) - 1, source_, ": the id ", max_id, " is too large");
  const auto id_count = static_cast<size_t>(max_id + 1);
  std::vector<std::string> spelling_of_id(id_count);
  std::vector<bool> in_vocab(id_count, false);
  token_bytes_.assign(id_count, "");
  for (const auto& item : vocab.items()) {
    const auto id = item.value().get<size_t>();
    LAYUP_CHECK(!in_vocab[id], source_, ": model.vocab gives both ", quoted(spelling_of_id[id]),
                " and ", quoted(item.key()), " the id ", id);
    in_vocab[id] = true;
    spelling_of_id[id] = item.key();
  }
  std::vector<const AddedToken*> added_of_id(id_count, nullptr);
  for (const AddedToken& token : added_tokens_) added_of_id[token.id] = &token;

  vocab_id_.reserve(vocab.size());
  for (size_t id = 0; id < id_count; ++id) {
    const AddedToken* added = added_of_id[id];
    LAYUP_CHECK(in_vocab[id] || added != nullptr, source_, ": no token has the id ", id,
                " (neither model.vocab nor added_tokens); ids must run 0..", max_id,
                " without gaps");
    if (!in_vocab[id]) {
      token_bytes_[id] = added->content;
      continue;
    }
    const std::string where = source_ + ": model.vocab";
    if (added != nullptr) {
      // An added token that repeats a vocab entry (GPT-2's <|endoftext|>) must be that entry;
      // the entry may be spelled outside the byte alphabet, then it is the added token's text.
      const bool same = spelling_of_id[id] == added->content ||
                        bytes_of_spelling(spelling_of_id[id], where) == added->content;
      LAYUP_CHECK(same, source_, ": the id ", id, " is the added token ", quoted(added->content),
                  " and the model.vocab token ", quoted(spelling_of_id[id]),
                  "; one id cannot be two different tokens");
      token_bytes_[id] = added->content;
    } else {
      token_bytes_[id] = bytes_of_spelling(spelling_of_id[id], where);
    }
    const auto [existing, inserted] = vocab_id_.emplace(token_bytes_[id], static_cast<int32_t>(id));
    LAYUP_CHECK(inserted, source_, ": model.vocab has the tokens ",
                quoted(spelling_of_id[existing->second]), " and ", quoted(spelling_of_id[id]),
                ", which are the same bytes");
  }
  for (int byte = 0; byte < 256; ++byte) {
    const auto found = vocab_id_.find(std::string(1, static_cast<char>(byte)));
    LAYUP_CHECK(found != vocab_id_.end(), source_, ": model.vocab has no token for the byte ",
                quoted(std::string(1, static_cast<char>(byte)), true),
                "; a byte-level BPE needs one for each of the 256 bytes (train with the whole "
                "ByteLevel alphabet as the initial alphabet)");
    byte_id_[byte] = found->second;
  }

  // Merges: rank = position in the list.
  const Json* merges = fields.find("merges");
  if (merges == nullptr) return;
  LAYUP_CHECK(merges->is_array(), source_, ": model.merges must be a JSON array, found ",
              describe(*merges));
  merges_.reserve(merges->size());
  std::unordered_map<uint64_t, size_t> index_of_pair;
  for (size_t index = 0; index < merges->size(); ++index) {
    const Json& merge = (*merges)[index];
    const std::string path = "model." + element("merges", index);
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      LAYUP_CHECK(space != std::string::npos && space > 0 && space + 1 < text.size() &&
                      text.find(' ', space + 1) == std::string::npos,
                  source_, ": ", path, " is ", quoted(text),
                  "; expected two tokens separated by one space");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      LAYUP_CHECK(
          merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
          source_, ": ", path, " is ", describe(merge),
          "; expected \"a b\" or a pair [\"a\", \"b\"] of tokens");
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const auto id_of = [&](const std::string& spelling, std::string_view what) {
      const auto found = vocab.find(spelling);
      LAYUP_CHECK(found != vocab.end(), source_, ": ", path, " (", quoted(left), " + ",
                  quoted(right), ") ", what, " ", quoted(spelling),
                  ", which is not a token of model.vocab");
      return found->get<int32_t>();
    };
    const int32_t left_id = id_of(left, "uses"), right_id = id_of(right, "uses");
    const int32_t merged_id = id_of(left + right, "makes");
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id);
    const auto [earlier, inserted] = index_of_pair.emplace(key, index);
    LAYUP_CHECK(inserted, source_, ": ", path, " (", quoted(left), " + ", quoted(right),
                ") repeats model.merges[", earlier->second, "]");
    merges_.emplace(key, BpeMerge{static_cast<int32_t>(index), merged_id});
  }
}

void HfTokenizer::read_pre_tokenizer(const Json& pre_tokenizer) {
  // One step: a Split, or ByteLevel (which must come last: what follows it would see the text
  // already spelled in the byte alphabet).
  bool byte_level_seen = false;
  const auto read_step = [&](const Json& value, const std::string& path) {
    const Fields fields(value, path, source_);
    const std::string type = fields.string("type");
    LAYUP_CHECK(!byte_level_seen, source_, ": ", path, " (", type,
                ") comes after the ByteLevel step; layup needs ByteLevel last");
    if (type == "ByteLevel") {
      fields.allow_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
      fields.require("add_prefix_space", false,
                     "it puts a space before the text, which layup does not do");
      byte_level_seen = true;
      PreTokenizerStep step;
      if (fields.boolean("use_regex", true)) step.pattern.emplace(kGpt2Pattern, path);
      pre_tokenizer_.push_back(std::move(step));
    } else if (type == "Split") {
      fields.allow_only({"type", "pattern", "behavior", "invert"});
      const std::string behavior = fields.string("behavior");
      LAYUP_CHECK(behavior == "Isolated", source_, ": ", path, ".behavior is \"", behavior,
                  "\"; layup implements \"Isolated\" only (every match its own piece)");
      fields.require("invert", false, "it splits on what the pattern does not match");
      const Fields pattern(fields.at("pattern"), path + ".pattern", source_);
      pattern.allow_only({"Regex", "String"});
      PreTokenizerStep step;
      if (pattern.find("Regex") != nullptr) {
        step.pattern.emplace(pattern.string("Regex"), source_ + ": " + path + ".pattern.Regex");
      } else {
        step.pattern = SplitPattern::literal(pattern.string("String"),
                                             source_ + ": " + path + ".pattern.String");
      }
      pre_tokenizer_.push_back(std::move(step));
    } else {
      fail(source_, ": ", path, ".type is \"", type,
           "\"; layup's byte-level BPE reads the pre-tokenizers ByteLevel and Split (behavior "
           "Isolated), alone or in a Sequence");
    }
  };

  const Fields fields(pre_tokenizer, "pre_tokenizer", source_);
  if (fields.string("type") == "Sequence") {
    fields.allow_only({"type", "pretokenizers"});
    const Json& steps = fields.array("pretokenizers");
    for (size_t i = 0; i < steps.size(); ++i) {
      read_step(steps[i], element("pre_tokenizer.pretokenizers", i));
    }
  } else {
    read_step(pre_tokenizer, "pre_tokenizer");
  }
  LAYUP_CHECK(byte_level_seen, source_,
              ": pre_tokenizer has no ByteLevel step; a byte-level BPE needs one, last, to map "
              "the text's bytes to the alphabet its vocabulary is spelled in");
}

void HfTokenizer::read_post_processor(const Json& post_processor, const std::string& path) {
  const Fields fields(post_processor, path, source_);
  const std::string type = fields.string("type");
  if (type == "ByteLevel") return;  // it trims offsets; the ids stay as they are
  if (type == "Sequence") {
    fields.allow_only({"type", "processors"});
    const Json& processors = fields.array("processors");
    for (size_t i = 0; i < processors.size(); ++i) {
      read_post_processor(processors[i], element(path + ".processors", i));
    }
    return;
  }
  LAYUP_CHECK(type == "TemplateProcessing", source_, ": ", path, ".type is \"", type,
              "\"; layup reads the post-processors TemplateProcessing and ByteLevel, alone or in "
              "a Sequence");
  LAYUP_CHECK(template_before_.empty() && template_after_.empty(), source_, ": ", path,
              " is a second TemplateProcessing; layup reads one");
  // "pair" is the template for two texts at once, which layup never encodes.
  fields.allow_only({"type", "single", "pair", "special_tokens"});
  const Json& single = fields.array("single");
  const Fields special_tokens(fields.at("special_tokens"), path + ".special_tokens", source_);
  bool sequence_seen = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_path = element(path + ".single", i);
    const Fields piece(single[i], piece_path, source_);
    piece.allow_only({"SpecialToken", "Sequence"});
    if (const Json* sequence = piece.find("Sequence")) {
      const Fields sequence_fields(*sequence, piece_path + ".Sequence", source_);
      LAYUP_CHECK(!sequence_seen && sequence_fields.string("id") == "A", source_, ": ", piece_path,
                  " must be the one {\"Sequence\": {\"id\": \"A\"}} of the template");
      sequence_seen = true;
      continue;
    }
    const std::string name =
        Fields(piece.at("SpecialToken"), piece_path + ".SpecialToken", source_).string("id");
    const Fields special(special_tokens.at(name), path + ".special_tokens." + name, source_);
    const Json& ids = special.array("ids");
    for (const Json& id : ids) {
      LAYUP_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                      id.get<int64_t>() < static_cast<int64_t>(token_bytes_.size()),
                  source_, ": ", special.name("ids"), " has ", id.dump(),
                  ", which is not an id of the vocabulary (0..", token_bytes_.size() - 1, ")");
      (sequence_seen ? template_after_ : template_before_).push_back(id.get<int32_t>());
    }
  }
  LAYUP_CHECK(sequence_seen, source_, ": ", path,
              ".single has no {\"Sequence\": {\"id\": \"A\"}}, the place of the text");
}

std::optional<int32_t> HfTokenizer::added_token_id(std::string_view content) const {
  for (const AddedToken& token : added_tokens_) {
    if (token.content == content) return token.id;
  }
  return std::nullopt;
}

int32_t HfTokenizer::document_separator() const {
  LAYUP_CHECK(document_separator_.has_value(), source_,
              ": no token to put between documents: the post-processor puts no token before the "
              "text, and there is no special added token <|endoftext|> or <|end_of_text|>");
  return *document_separator_;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, EncodeOptions options) const {
  // The state belongs to this call, so concurrent calls share nothing mutable.
  EncodeState state;
  state.recognize_special = options.recognize_special_tokens;
  state.ids.reserve(text.size() / 3);
  if (options.add_post_processor_tokens) state.ids = template_before_;
  encode_around_added_tokens(text, 0, state);
  if (options.add_post_processor_tokens) {
    state.ids.insert(state.ids.end(), template_after_.begin(), template_after_.end());
  }
  return std::move(state.ids);
}

void HfTokenizer::encode_around_added_tokens(std::string_view text, int pass,
                                             EncodeState& state) const {
  const auto encode_stretch = [&](std::string_view stretch) {
    if (pass == 1) {
      encode_text(stretch, state);
    } else if (normalizer_ && !stretch.empty()) {
      encode_around_added_tokens(
          state.normalized.emplace_back(normalize_unicode(stretch, *normalizer_)), 1, state);
    } else {
      encode_around_added_tokens(stretch, 1, state);
    }
  };
  const AddedTokenPass& tokens = added_token_passes_[pass];
  // The token at `position` to take, if any: the longest that is looked for.
  const auto token_at = [&](size_t position) -> const AddedToken* {
    if (!tokens.first_byte[static_cast<unsigned char>(text[position])]) return nullptr;
    for (size_t length : tokens.lengths) {
      if (length > text.size() - position) continue;
      const auto found = tokens.index_of_content.find(text.substr(position, length));
      if (found == tokens.index_of_content.end()) continue;
      const AddedToken& token = added_tokens_[found->second];
      if (state.recognize_special || !token.special) return &token;
    }
    return nullptr;
  };
  size_t stretch_start = 0;
  for (size_t position = 0; position < text.size();) {
    const AddedToken* found = token_at(position);
    if (found == nullptr) {
      ++position;
      continue;
    }
    encode_stretch(text.substr(stretch_start, position - stretch_start));
    state.ids.push_back(found->id);
    position += found->content.size();
    stretch_start = position;
  }
  encode_stretch(text.substr(stretch_start));
}

void HfTokenizer::encode_text(std::string_view text, EncodeState& state) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text}, next;
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    if (!step.pattern) continue;
    next.clear();
    for (std::string_view piece : pieces) step.pattern->split(piece, next);
    pieces.swap(next);
  }
  std::vector<int32_t>& ids = state.ids;
  for (std::string_view piece : pieces)
    append_piece_ids(
        piece, state.cache, ids,
        [this](std::string_view p, std::vector<int32_t>& out) { encode_piece(p, out); });
}

// tokenizers' rule: a pair of parts merges if the pair of their ids is in model.merges.
void HfTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (const auto found = vocab_id_.find(piece); found != vocab_id_.end()) {
      ids.push_back(found->second);
      return;
    }
  }
  std::vector<int32_t> byte_ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    byte_ids[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  }
  const auto merge_of = [&](size_t, size_t, int32_t left, int32_t right) {
    const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
    const auto found = merges_.find(key);
    return found == merges_.end() ? BpeMerge{} : found->second;
  };
  merge_bpe_parts(std::move(byte_ids), merge_of, ids);
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    LAYUP_CHECK(id >= 0 && id < vocab_size(), "cannot decode token id ", id, ": the vocabulary of ",
                source_, " has ids 0..", vocab_size() - 1);
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace layup
