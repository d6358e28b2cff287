// Loading a Hugging Face tokenizer.json and encoding with it; see hf_tokenizer.h for what is read.
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_files.h"
#include "tokenizer/tokenizer_json_fields.h"

namespace layup {
namespace {

using Json = nlohmann::json;

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
  const JsonFields fields(root, "", source);
  fields.allow_only({"version", "truncation", "padding", "added_tokens", "normalizer",
                     "pre_tokenizer", "model", "post_processor", "decoder"});
  fields.require("truncation", nullptr, "truncation cuts the ids of long texts");
  fields.require("padding", nullptr, "padding adds ids to short texts");
  if (const Json* normalizer = fields.find("normalizer")) {
    tokenizer.normalizer_ = HfNormalizer::read(*normalizer, source);
  }
  if (const Json* added = fields.find("added_tokens")) {
    LAYUP_CHECK(added->is_array(), source, ": added_tokens must be a JSON array, found ",
                describe_json(*added));
    tokenizer.read_added_tokens(*added);
  }
  tokenizer.pre_tokenizer_ = HfPreTokenizer::read(fields.find("pre_tokenizer"), source);
  const bool byte_level = tokenizer.pre_tokenizer_.byte_level();
  tokenizer.model_ = HfBpeModel::read(fields.at("model"), byte_level, source);
  tokenizer.read_token_ids();
  if (const Json* post_processor = fields.find("post_processor")) {
    tokenizer.read_post_processor(*post_processor, "post_processor");
  }
  tokenizer.decoder_ = HfDecoder::read(fields.find("decoder"), byte_level, source);

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
    const std::string path = json_element("added_tokens", i);
    const JsonFields fields(added_tokens[i], path, source_);
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
    // As tokenizers does, a token matched in normalized text is looked for as the normalizer
    // writes it (Llama 2's "<tool>" as "▁<tool>", so only after a space or at the start).
    token.text =
        token.normalized && normalizer_ ? normalizer_->normalize(token.content) : token.content;
    LAYUP_CHECK(!token.text.empty(), source_, ": ", path, ".content is empty once normalized");
    added_tokens_.push_back(std::move(token));
  }
  for (size_t index = 0; index < added_tokens_.size(); ++index) {
    const AddedToken& token = added_tokens_[index];
    AddedTokenPass& pass = added_token_passes_[token.normalized ? 1 : 0];
    pass.first_byte[static_cast<unsigned char>(token.text[0])] = true;
    pass.lengths.push_back(token.text.size());
    const auto [other, inserted] = pass.index_of_text.emplace(token.text, index);
    LAYUP_CHECK(inserted, source_, ": the added tokens ",
                quoted(added_tokens_[other->second].content), " and ", quoted(token.content),
                " are the same text once normalized, ", quoted(token.text));
  }
  for (AddedTokenPass& pass : added_token_passes_) {
    std::sort(pass.lengths.begin(), pass.lengths.end(), std::greater<>());
    pass.lengths.erase(std::unique(pass.lengths.begin(), pass.lengths.end()), pass.lengths.end());
  }
}

void HfTokenizer::read_token_ids() {
  size_t id_end = model_.id_end();
  for (const AddedToken& token : added_tokens_) id_end = std::max<size_t>(id_end, token.id + 1);
  std::vector<const AddedToken*> added_of_id(id_end, nullptr);
  for (const AddedToken& token : added_tokens_) added_of_id[token.id] = &token;
  tokens_by_id_.assign(id_end, "");
  for (size_t id = 0; id < id_end; ++id) {
    const AddedToken* added = added_of_id[id];
    const std::string* in_vocab = id < model_.id_end() ? model_.token(id) : nullptr;
    LAYUP_CHECK(in_vocab != nullptr || added != nullptr, source_, ": no token has the id ", id,
                " (neither model.vocab nor added_tokens); ids must run 0..", id_end - 1,
                " without gaps");
    if (added == nullptr) {
      tokens_by_id_[id] = *in_vocab;
      continue;
    }
    // An added token that repeats a vocab entry (GPT-2's <|endoftext|>, Llama 2's <s>) must be
    // that entry; a byte-level entry may be spelled outside the byte alphabet, then it is the
    // added token's text.
    LAYUP_CHECK(
        in_vocab == nullptr || *in_vocab == added->content || model_.spelling(id) == added->content,
        source_, ": the id ", id, " is the added token ", quoted(added->content),
        " and the model.vocab token ", quoted(model_.spelling(id)),
        "; one id cannot be two different tokens");
    // tokenizers decodes a normalized added token as it is looked for.
    tokens_by_id_[id] = added->text;
  }
}

void HfTokenizer::read_post_processor(const Json& post_processor, const std::string& path) {
  const JsonFields fields(post_processor, path, source_);
  const std::string type = fields.string("type");
  if (type == "ByteLevel") return;  // it trims offsets; the ids stay as they are
  if (type == "Sequence") {
    fields.allow_only({"type", "processors"});
    const Json& processors = fields.array("processors");
    for (size_t i = 0; i < processors.size(); ++i) {
      read_post_processor(processors[i], json_element(path + ".processors", i));
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
  const JsonFields special_tokens(fields.at("special_tokens"), path + ".special_tokens", source_);
  bool sequence_seen = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_path = json_element(path + ".single", i);
    const JsonFields piece(single[i], piece_path, source_);
    piece.allow_only({"SpecialToken", "Sequence"});
    if (const Json* sequence = piece.find("Sequence")) {
      const JsonFields sequence_fields(*sequence, piece_path + ".Sequence", source_);
      LAYUP_CHECK(!sequence_seen && sequence_fields.string("id") == "A", source_, ": ", piece_path,
                  " must be the one {\"Sequence\": {\"id\": \"A\"}} of the template");
      sequence_seen = true;
      continue;
    }
    const std::string name =
        JsonFields(piece.at("SpecialToken"), piece_path + ".SpecialToken", source_).string("id");
    const JsonFields special(special_tokens.at(name), path + ".special_tokens." + name, source_);
    const Json& ids = special.array("ids");
    for (const Json& id : ids) {
      LAYUP_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                      id.get<int64_t>() < static_cast<int64_t>(tokens_by_id_.size()),
                  source_, ": ", special.name("ids"), " has ", id.dump(),
                  ", which is not an id of the vocabulary (0..", tokens_by_id_.size() - 1, ")");
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
  encode_around_added_tokens(text, 0, true, state);
  if (options.add_post_processor_tokens) {
    state.ids.insert(state.ids.end(), template_after_.begin(), template_after_.end());
  }
  return std::move(state.ids);
}

void HfTokenizer::encode_around_added_tokens(std::string_view text, int pass, bool at_input_start,
                                             EncodeState& state) const {
  const auto encode_stretch = [&](std::string_view stretch, bool starts_input) {
    if (pass == 1) {
      encode_text(stretch, starts_input, state);
    } else if (normalizer_ && !stretch.empty()) {
      encode_around_added_tokens(state.rewritten.emplace_back(normalizer_->normalize(stretch)), 1,
                                 starts_input, state);
    } else {
      encode_around_added_tokens(stretch, 1, starts_input, state);
    }
  };
  const AddedTokenPass& tokens = added_token_passes_[pass];
  // The token at `position` to take, if any: the longest that is looked for.
  const auto token_at = [&](size_t position) -> const AddedToken* {
    if (!tokens.first_byte[static_cast<unsigned char>(text[position])]) return nullptr;
    for (size_t length : tokens.lengths) {
      if (length > text.size() - position) continue;
      const auto found = tokens.index_of_text.find(text.substr(position, length));
      if (found == tokens.index_of_text.end()) continue;
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
    encode_stretch(text.substr(stretch_start, position - stretch_start),
                   at_input_start && stretch_start == 0);
    state.ids.push_back(found->id);
    position += found->text.size();
    stretch_start = position;
  }
  encode_stretch(text.substr(stretch_start), at_input_start && stretch_start == 0);
}

void HfTokenizer::encode_text(std::string_view text, bool at_input_start,
                              EncodeState& state) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces;
  pre_tokenizer_.split(text, at_input_start, state.rewritten, pieces);
  for (std::string_view piece : pieces) {
    append_piece_ids(
        piece, state.cache, state.ids,
        [this](std::string_view p, std::vector<int32_t>& out) { model_.encode_piece(p, out); });
  }
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    LAYUP_CHECK(id >= 0 && id < vocab_size(), "cannot decode token id ", id, ": the vocabulary of ",
                source_, " has ids 0..", vocab_size() - 1);
    tokens.push_back(tokens_by_id_[id]);
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace layup
