// sd-webui-tome: hover hints, the Hires fix pass group's visibility and a live token count for the ToMe accordion.
// With a speed preset, the token count is shown per model family (SD1/SD2, SDXL) from the configs the Python side
// puts on the note under the speed selector (`data-tome-first`, `data-tome-hires` on its div.tome-cap-note).
//
// The WebUI loads every extension's javascript/*.js as a classic script into one global scope, so everything here
// lives in this IIFE and nothing is added to `window`. It uses only the WebUI globals gradioApp() and onUiLoaded()
// (script.js), and reads the controls by the ids the Python side gives them: `script_<tab>_tome_<item>`
// (tome_webui/ui.py, ELEM_ITEMS) and the WebUI's own `<tab>_width`, `<tab>_height`, `txt2img_hr`, `txt2img_hr_*`.
(function() {
    'use strict';

    var TABS = ['txt2img', 'img2img'];

    // Hints for the controls that have no tome_core FieldSpec. Every field's hint comes from its FieldSpec.help,
    // which the Python side passes as `tooltip=`: the WebUI's patched gradio sends it to the page as
    // `props.webui_tooltip`. Those win over this table, so the texts keep a single source in Python.
    var OWN_HINTS = {
        enable: 'Token Merging: merges similar image tokens in the UNet\'s attention so every step runs faster, at ' +
            'some loss of fine detail. Unchecked, generation is left exactly as it is.',
        hr_mode: 'What the Hires fix pass merges. "Same as first pass" reuses the settings above; "Own settings" ' +
            'can merge more, where the many tokens of the upscaled image make it pay most; "Off" keeps the full ' +
            'detail of the final pass at its full cost.'
    };

    var TOKEN_HINT_TITLE = 'Image tokens per attention layer, before and after merging, at the size set above ' +
        '(latent = pixels / 8; level 1/1 is the full latent, 1/2 the first downsampled level, ...). With max ' +
        'downsample "auto" ToMe merges at 1/1 on SD1/SD2 and at 1/2 and 1/4 on SDXL; a preset has its own ' +
        'settings per model. The browser cannot tell which model is loaded, so both are shown.';

    // The levels that hold attention, per model family, and the ones max downsample "auto" picks there
    // (tome_core's auto_levels: the first level with attention, plus deeper ones holding more transformer blocks).
    var FAMILIES = [['sd', 'SD1/SD2'], ['sdxl', 'SDXL']];
    var ATTENTION_LEVELS = {sd: [1, 2, 4, 8], sdxl: [2, 4]};
    var AUTO_LEVELS = {sd: [1], sdxl: [2, 4]};

    function app() {
        return gradioApp();
    }

    function el(id) {
        return app().querySelector('#' + id);
    }

    function our(tab, item) {
        return el('script_' + tab + '_tome_' + item);
    }

    function numberOf(id) {
        // gradio 3 sliders hold a number box and a range; the number box comes first.
        var input = app().querySelector('#' + id + ' input[type=number]') || app().querySelector('#' + id + ' input');
        return input ? parseFloat(input.value) : NaN;
    }

    function radioOf(id) {
        var input = app().querySelector('#' + id + ' input:checked');
        return input ? input.value : null;
    }

    function checkedOf(id) {
        var input = app().querySelector('#' + id + ' input');
        return input ? input.checked : null;
    }

    // ------------------------------------------------------------------------------------------- hover hints

    function applyHints(tab) {
        var prefix = 'script_' + tab + '_tome_';
        var texts = {};
        var components = (window.gradio_config && window.gradio_config.components) || [];
        components.forEach(function(comp) {
            var id = comp.props && comp.props.elem_id;
            if (id && id.indexOf(prefix) === 0 && comp.props.webui_tooltip) {
                texts[id.slice(prefix.length).replace(/-checkbox$/, '')] = comp.props.webui_tooltip;
            }
        });
        Object.keys(OWN_HINTS).forEach(function(item) {
            texts[item] = texts[item] || OWN_HINTS[item];
        });
        Object.keys(texts).forEach(function(item) {
            // The InputAccordion's own checkbox is hidden: its hint goes on the label row, where its visible
            // checkbox is, not on the whole accordion (that would show it over every gap between the controls).
            var target = item === 'enable' ? app().querySelector('#' + prefix + 'enable > .label-wrap') : our(tab, item);
            // A title already there came from the WebUI's hints.js and may be localized: keep it.
            if (target && !target.title) {
                target.title = texts[item];
            }
        });
    }

    // ------------------------------------------------------------------------------------- Hires fix group

    // Whether the WebUI's Hires fix is on: the hidden checkbox of its InputAccordion (v1.6+) holds the value the
    // generation gets; inputAccordion.js keeps it in step with the visible checkbox and with pasted infotext.
    // null when there is no such control (another UI): then our group stays visible rather than lost.
    function hiresOn() {
        var box = app().querySelector('#txt2img_hr-checkbox input') || app().querySelector('#txt2img_enable_hr input');
        return box ? box.checked : null;
    }

    function syncHiresGroup() {
        var group = our('txt2img', 'hires');
        var on = hiresOn();
        if (group && on !== null) {
            var display = on ? '' : 'none';
            if (group.style.display !== display) {
                group.style.display = display;
            }
        }
    }

    // ------------------------------------------------------------------------------------------ token hint

    // Tokens at one UNet level (its latent is ceil(h / level) by ceil(w / level): the UNet's stride-2 convolutions
    // round up), before and after, exactly as tome_core.patch.describe() counts them:
    // merge mode keeps N - min(int(N * r), N - (h // sy) * (w // sx)) with r capped at 1 - 1/(sx*sy);
    // kv mode keeps every query and attends to ceil(h/sy) * ceil(w/sx) pooled keys/values.
    function levelTokens(latH, latW, level, cfg) {
        var h = Math.ceil(latH / level);
        var w = Math.ceil(latW / level);
        var n = h * w;
        if (!cfg.merges) {
            return [n, n];
        }
        if (cfg.mode === 'kv') {
            return [n, Math.ceil(h / cfg.sy) * Math.ceil(w / cfg.sx)];
        }
        var ratio = Math.min(cfg.ratio, 1 - 1 / (cfg.sx * cfg.sy));
        return [n, n - Math.min(Math.floor(n * ratio), n - Math.floor(h / cfg.sy) * Math.floor(w / cfg.sx))];
    }

    function describe(width, height, cfg) {
        if (!(width > 0 && height > 0 && cfg.ratio >= 0 && cfg.sx >= 1 && cfg.sy >= 1)) {
            return '';
        }
        // The WebUI's latent is pixels // 8 (a hires size kept to the aspect ratio need not divide by 8).
        var latH = Math.floor(height / 8);
        var latW = Math.floor(width / 8);
        var unit = cfg.mode === 'kv' ? ' keys/values' : ' tokens';
        var list = function(levels, withUnit) {
            return levels.map(function(level, i) {
                var t = levelTokens(latH, latW, level, cfg);
                return t[0] + ' \u2192 ' + t[1] + (withUnit && i === 0 ? unit : '') + ' at 1/' + level;
            }).join(', ');
        };
        if (cfg.maxDownsample === 'auto') {
            // Which levels "auto" merges depends on the model, which the page cannot see (tome_core's auto_levels:
            // the first level with attention, plus deeper ones holding more transformer blocks). SD1/SD2: 1/1.
            // SDXL has no attention at 1/1 and 60 of its 70 blocks at 1/4: 1/2 and 1/4.
            return list([1], true) + ' (SDXL: ' + list([2, 4], false) + ')';
        }
        // An explicit max downsample merges every level down to it that has attention (on SD1 all of them).
        return list([1, 2, 4, 8].filter(function(level) {
            return level <= parseInt(cfg.maxDownsample, 10);
        }), true);
    }

    // One pass of a preset, per model family: "SD1/SD2: 4096 -> 2048 tokens at 1/1; SDXL: ...", each family with
    // its own config (`configs`: family -> config, from the note).
    function describeFamilies(width, height, configs) {
        if (!(width > 0 && height > 0)) {
            return '';
        }
        var latH = Math.floor(height / 8);
        var latW = Math.floor(width / 8);
        return FAMILIES.map(function(family) {
            var cfg = configs[family[0]];
            if (!cfg) {
                return null;
            }
            var levels = cfg.maxDownsample === 'auto' ? AUTO_LEVELS[family[0]] : ATTENTION_LEVELS[family[0]].filter(
                function(level) {
                    return level <= parseInt(cfg.maxDownsample, 10);
                });
            var unit = cfg.mode === 'kv' ? ' keys/values' : ' tokens';
            var text = levels.map(function(level, i) {
                var t = levelTokens(latH, latW, level, cfg);
                return t[0] + ' \u2192 ' + t[1] + (i === 0 ? unit : '') + ' at 1/' + level;
            }).join(', ');
            return family[1] + ': ' + (text || 'no attention at these levels');
        }).filter(Boolean).join('; ');
    }

    // The per-family configs the note holds for a pass ('first' or 'hires'), or null when that pass uses the
    // controls (Custom). `undefined` while the note has not caught up with the speed selectors yet.
    function noteConfigs(tab, pass) {
        var note = app().querySelector('#script_' + tab + '_tome_cap_note .tome-cap-note');
        if (!note) {
            return null;
        }
        // The note names the selectors it was made for: until it matches them, its configs are another choice's.
        var selectors = tab === 'txt2img' ? ['preset', 'hr_mode', 'hr_preset'] : ['preset'];
        var stale = selectors.some(function(item) {
            var value = radioOf('script_' + tab + '_tome_' + item);
            return value !== null && note.getAttribute('data-tome-' + item.replace('_', '-')) !== value;
        });
        if (stale) {
            return undefined;
        }
        var raw = note.getAttribute('data-tome-' + pass);
        if (!raw) {
            return null;
        }
        try {
            return JSON.parse(raw);
        } catch (e) {
            return undefined;
        }
    }

    // The settings a pass merges with, read from the controls; `hr` is '' (first pass) or 'hr_' (own hires).
    function readConfig(tab, hr) {
        var id = function(item) {
            return 'script_' + tab + '_tome_' + item;
        };
        var targets = ['merge_attn', 'merge_crossattn', 'merge_mlp'].map(function(item) {
            return checkedOf(id(item));
        });
        var mode = radioOf(id('mode')) || 'merge';
        return {
            ratio: numberOf(id(hr + 'ratio')),
            sx: numberOf(id(hr + 'sx')),
            sy: numberOf(id(hr + 'sy')),
            maxDownsample: radioOf(id(hr + 'max_downsample')) || 'auto',
            mode: mode,
            // Unknown (null) counts as merging; kv mode only uses self-attention.
            merges: mode === 'kv' ? targets[0] !== false : targets.some(function(on) {
                return on !== false;
            })
        };
    }

    // The size of the Hires fix pass, as the WebUI's StableDiffusionProcessingTxt2Img computes it: "Upscale by"
    // unless "Resize width/height to" is set; with both set, the image is cropped to exactly that size.
    function hiresSize(width, height) {
        var scale = numberOf('txt2img_hr_scale');
        var rx = numberOf('txt2img_hr_resize_x') || 0;
        var ry = numberOf('txt2img_hr_resize_y') || 0;
        if (rx && ry) {
            return [rx, ry];
        }
        if (rx) {
            return [rx, Math.floor(rx * height / width)];
        }
        if (ry) {
            return [Math.floor(ry * width / height), ry];
        }
        return [Math.floor(width * scale), Math.floor(height * scale)];
    }

    function hintLines(tab) {
        var width = numberOf(tab + '_width');
        var height = numberOf(tab + '_height');
        var first = readConfig(tab, '');
        var firstConfigs = noteConfigs(tab, 'first');
        if (firstConfigs === undefined) {
            return null; // a preset was just chosen: wait for its note
        }
        var lines = [firstConfigs ? describeFamilies(width, height, firstConfigs) : describe(width, height, first)];
        if (tab === 'txt2img' && hiresOn()) {
            var mode = radioOf('script_txt2img_tome_hr_mode') || 'same';
            var size = hiresSize(width, height);
            var label = 'Hires pass (' + size[0] + '\u00d7' + size[1] + '): ';
            if (!(size[0] > 0 && size[1] > 0)) {
                return lines.filter(Boolean); // no Hires fix size controls on this page
            }
            var hiresConfigs = noteConfigs(tab, 'hires');
            if (hiresConfigs === undefined) {
                return null;
            }
            if (mode === 'off') {
                lines.push(label + 'no merging');
            } else if (hiresConfigs) {
                lines.push(label + describeFamilies(size[0], size[1], hiresConfigs));
            } else if (firstConfigs) {
                // Own custom ratio, strides and max downsample over the first pass's preset, per family (read
                // here, not from the note: a note made for a value typed half-way may arrive last).
                var own = readConfig(tab, 'hr_');
                var over = {};
                Object.keys(firstConfigs).forEach(function(family) {
                    over[family] = Object.assign({}, firstConfigs[family], {
                        ratio: own.ratio, sx: own.sx, sy: own.sy, maxDownsample: own.maxDownsample
                    });
                });
                lines.push(label + describeFamilies(size[0], size[1], over));
            } else {
                var cfg = mode === 'own' ? readConfig(tab, 'hr_') : first;
                // The hires pass takes only ratio, strides and max downsample of its own; the rest is shared.
                cfg.mode = first.mode;
                cfg.merges = first.merges;
                lines.push(label + describe(size[0], size[1], cfg));
            }
        }
        return lines.filter(Boolean);
    }

    // The hint lives in the cap_note block (the HTML note under the accordion title). gradio re-renders only the
    // note's inner .prose element on updates, so a node appended to the block itself stays.
    function tokenHint(tab) {
        var hint = our(tab, 'token_hint');
        var anchor = our(tab, 'cap_note');
        if (!hint && anchor) {
            hint = document.createElement('div');
            hint.id = 'script_' + tab + '_tome_token_hint';
            hint.className = 'tome-token-hint';
            hint.title = TOKEN_HINT_TITLE;
            // Inline style: the extension ships no style.css; these are gradio's theme variables.
            hint.style.cssText = 'font-size: var(--text-sm); color: var(--body-text-color-subdued); margin-top: 0.25em;';
            anchor.appendChild(hint);
        }
        return hint;
    }

    function syncTokenHint(tab) {
        var hint = tokenHint(tab);
        if (!hint) {
            return;
        }
        var lines = hintLines(tab);
        if (lines === null) {
            return; // the note is being updated: keep the last text until the next refresh
        }
        // Write only on change: every DOM write wakes the WebUI's onUiUpdate callbacks of all extensions.
        if (hint.dataset.text !== lines.join('\n')) {
            hint.dataset.text = lines.join('\n');
            hint.replaceChildren.apply(hint, lines.map(function(line) {
                var div = document.createElement('div');
                div.textContent = line;
                return div;
            }));
        }
    }

    // --------------------------------------------------------------------------------------------- wiring

    function refresh() {
        syncHiresGroup();
        TABS.forEach(syncTokenHint);
    }

    var scheduled = false;

    // Deferred to after the event: a click on the Hires fix visible checkbox reaches this capturing listener
    // before inputAccordion.js has copied it to the hidden checkbox we read.
    function schedule() {
        if (!scheduled) {
            scheduled = true;
            setTimeout(function() {
                scheduled = false;
                refresh();
            }, 0);
        }
    }

    onUiLoaded(function() {
        TABS.forEach(applyHints);
        refresh();
        // User edits arrive as input/change events (updateInput() from other scripts too).
        app().addEventListener('input', schedule, true);
        app().addEventListener('change', schedule, true);
        // Values set from Python (pasted infotext, ui-config, the dimension swap) change input properties without
        // any event or DOM mutation, so a slow poll catches those; refresh() reads a few inputs and writes nothing
        // unless the text changed.
        setInterval(refresh, 1000);
    });
})();
